// General matrix product: the one place the CPU backend calls BLAS.
#include <cblas.h>

#include <type_traits>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// C (M,N) = alpha * op(A) (M,K) · op(B) (K,N) + beta * C, row-major, leading dimensions given.
// Inside an OpenMP parallel region the OpenMP build of OpenBLAS runs single-threaded, so callers
// that parallelise over independent products (attention heads) do not oversubscribe the cores.
template <typename F>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, F alpha, const F* A, int lda, const F* B,
          int ldb, F beta, F* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // BLAS rejects lda < 1 here; the product is empty, only the beta scaling remains
    for (int i = 0; i < M; i++) {
      F* c = C + (size_t)i * ldc;
      for (int j = 0; j < N; j++) c[j] = beta == F(0) ? F(0) : beta * c[j];
    }
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<F, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int,
                          float, float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*, int,
                           double, double*, int);

}  // namespace tessera::cpu
