// General matrix product: the one place the CUDA backend calls cuBLAS, twin of gemm.cpp.
//
// cuBLAS is column-major. A row-major (M,N) matrix with leading dimension ld is, read
// column-major, its (N,M) transpose with the same ld, so the row-major C = op(A) op(B) is the
// column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands and the sizes M and N, keep each operand's
// transpose flag. No data moves.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {
cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }
}  // namespace

void gemm_ex(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
             const void* B, int ldb, cudaDataType_t ab_type, float beta, void* C, int ldc,
             cudaDataType_t c_type) {
  if (M <= 0 || N <= 0) return;
  // K == 0 is C = beta C in cuBLAS as in BLAS (the CPU twin special-cases it for OpenBLAS only).
  // CUBLAS_COMPUTE_32F: fp32 products and sums; for fp32 operands that excludes TF32.
  CUBLAS_CHECK(cublasGemmEx(blas(), op(trans_b), op(trans_a), N, M, K, &alpha, B, ab_type, ldb, A,
                            ab_type, lda, &beta, C, c_type, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const void* A, int lda, long long stride_a, const void* B, int ldb,
                          long long stride_b, cudaDataType_t ab_type, float beta, void* C,
                          int ldc, long long stride_c, cudaDataType_t c_type, int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas(), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                                          ab_type, ldb, stride_b, A, ab_type, lda, stride_a, &beta,
                                          C, c_type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
}

// C (M,N) = alpha * op(A) (M,K) · op(B) (K,N) + beta * C, row-major, leading dimensions given.
template <typename F>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const F* A, int lda,
          const F* B, int ldb, float beta, F* C, int ldc) {
  gemm_ex(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, data_type<F>(), beta, C, ldc,
          data_type<F>());
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int,
                          float, float*, int);
template void gemm<bf16>(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int,
                         float, bf16*, int);

}  // namespace tessera::cuda
