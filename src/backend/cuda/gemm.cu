// General matrix product: the one place the CUDA backend calls cuBLAS, twin of gemm.cpp.
//
// cuBLAS is column-major. A row-major (M,N) matrix with leading dimension ld is, read
// column-major, its (N,M) transpose with the same ld, so the row-major C = op(A) op(B) is the
// column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands and the sizes M and N, keep each operand's
// transpose flag. No data moves.
#include <stdexcept>
#include <vector>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// C = beta C over `batch` row-major (M,N) matrices `stride` elements apart; beta == 0 writes zeros
// without reading C (it may hold NaN).
template <typename T>
__global__ void scale_matrices_kernel(T* C, int M, int N, int ldc, long long stride, int batch,
                                      float beta) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(batch) * M * N) return;
  const size_t e = i / (size_t(M) * N), r = i / N % M, c = i % N;
  T& x = C[e * stride + r * size_t(ldc) + c];
  x = from_float<T>(beta == 0.0f ? 0.0f : beta * to_float(x));
}

// A product over K = 0 is C = beta C. cuBLAS refuses it when an operand's leading dimension is 0
// (the LM-head backward of a tensor-parallel rank that holds only padding rows has such a
// gradient), so it never gets there.
void scale_matrices(void* C, cudaDataType_t type, int M, int N, int ldc, long long stride,
                    int batch, float beta) {
  if (beta == 1.0f) return;
  constexpr int kThreads = 256;
  const unsigned grid = blocks_for(size_t(batch) * M * N, kThreads);
  if (type == CUDA_R_32F)
    launch<scale_matrices_kernel<float>>(grid, kThreads, 0, stream(), static_cast<float*>(C), M,
                                         N, ldc, stride, batch, beta);
  else
    launch<scale_matrices_kernel<bf16>>(grid, kThreads, 0, stream(), static_cast<bf16*>(C), M, N,
                                        ldc, stride, batch, beta);
  CUDA_CHECK_LAUNCH();
}

long g_grouped_calls = 0;  // cublasGemmGroupedBatchedEx calls (grouped_gemm_calls)

// The operand pointers of up to kGroupedProblems products, passed by value: the launch copies
// them, so the device arrays cuBLAS reads are written in stream order with no host wait.
struct OperandPointers {
  const void* a[device::kGroupedProblems];
  const void* b[device::kGroupedProblems];
  void* c[device::kGroupedProblems];
  int count;
};

__global__ void store_pointers_kernel(void** out, OperandPointers p) {
  const int i = int(threadIdx.x);
  if (i >= p.count) return;
  out[i] = const_cast<void*>(p.a[i]);
  out[device::kGroupedProblems + i] = const_cast<void*>(p.b[i]);
  out[2 * device::kGroupedProblems + i] = p.c[i];
}

}  // namespace

void gemm_ex(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
             const void* B, int ldb, cudaDataType_t ab_type, float beta, void* C, int ldc,
             cudaDataType_t c_type) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_matrices(C, c_type, M, N, ldc, 0, 1, beta);
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
  if (K <= 0) return scale_matrices(C, c_type, M, N, ldc, stride_c, batch, beta);
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas(), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                                          ab_type, ldb, stride_b, A, ab_type, lda, stride_a, &beta,
                                          C, c_type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
}

void gemm_grouped(bool trans_a, bool trans_b, int N, float alpha, const GroupedProduct* products,
                  int count, int lda, int ldb, cudaDataType_t ab_type, int ldc,
                  cudaDataType_t c_type) {
  if (N <= 0 || count == 0) return;
  if (c_type != ab_type)  // cuBLAS's grouped call takes A, B and C of one type
    throw std::logic_error("gemm_grouped: C's type differs from A's and B's");
  constexpr int kMax = device::kGroupedProblems;
  void** arrays = device::pointer_scratch();
  // Column-major as gemm_ex: cuBLAS's A is our B, its B our A, its (m, n) our (N, M_i). What
  // every product shares, once; each product is its own group (their sizes differ).
  const std::vector<cublasOperation_t> ta(kMax, op(trans_b)), tb(kMax, op(trans_a));
  const std::vector<int> m(kMax, N), lda_of(kMax, ldb), ldb_of(kMax, lda), ldc_of(kMax, ldc),
      one(kMax, 1);
  const std::vector<float> alphas(kMax, alpha);
  OperandPointers p{};
  std::vector<int> n, k;
  std::vector<float> betas;
  auto run = [&] {
    const int g = p.count;
    if (g == 0) return;
    launch<store_pointers_kernel>(1, kMax, 0, stream(), arrays, p);
    CUDA_CHECK_LAUNCH();
    CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        blas(), ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(), arrays,
        ab_type, lda_of.data(), arrays + kMax, ab_type, ldb_of.data(), betas.data(),
        arrays + 2 * kMax, c_type, ldc_of.data(), g, one.data(), CUBLAS_COMPUTE_32F));
    g_grouped_calls++;
    p.count = 0;
    n.clear();
    k.clear();
    betas.clear();
  };
  for (int i = 0; i < count; i++) {
    const GroupedProduct& q = products[i];
    if (q.M <= 0) continue;
    if (q.K <= 0) {
      scale_matrices(q.C, c_type, q.M, N, ldc, 0, 1, q.beta);
      continue;
    }
    p.a[p.count] = q.B;
    p.b[p.count] = q.A;
    p.c[p.count] = q.C;
    p.count++;
    n.push_back(q.M);
    k.push_back(q.K);
    betas.push_back(q.beta);
    if (p.count == kMax) run();
  }
  run();
}

long grouped_gemm_calls() { return g_grouped_calls; }

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
