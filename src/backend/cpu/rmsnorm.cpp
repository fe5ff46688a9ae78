// RMSNorm over the last dimension, as LLaMA's (torch: x * rsqrt(mean(x²) + eps) * weight); twin
// of rmsnorm.cu.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

static constexpr int kColBlock = 64;

// out, inp (N,C); weight (C); rstd (N) = 1/sqrt(mean(x²) + eps) saved for backward.
// The mean square is summed in double, as LayerNorm's statistics.
template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* weight, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    const F s = F(1.0 / std::sqrt(ss / C + eps));
    F* o = out + (size_t)n * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

// dout, inp (N,C); weight (C); rstd (N) from the forward. Accumulates dinp (N,C), dweight (C).
// With xhat = x * rstd and g = weight * dout: dinp = rstd * (g - xhat * mean(g * xhat)) (the
// derivative of rstd gives the second term), dweight = Σ_rows dout * xhat.
// Rows go to threads for dinp, column blocks for dweight (as layernorm_backward: no race, the
// order of every sum fixed).
template <typename F>
void rmsnorm_backward(F* dinp, F* dweight, const F* dout, const F* inp, const F* weight,
                      const F* rstd, int N, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; n++) {
      const F* x = inp + (size_t)n * C;
      const F* d = dout + (size_t)n * C;
      const F s = rstd[n];
      double gxsum = 0.0;
#pragma omp simd reduction(+ : gxsum)
      for (int c = 0; c < C; c++) gxsum += weight[c] * d[c] * (x[c] * s);
      const F gxmean = F(gxsum / C);
      F* di = dinp + (size_t)n * C;
#pragma omp simd
      for (int c = 0; c < C; c++) di[c] += s * (weight[c] * d[c] - (x[c] * s) * gxmean);
    }
#pragma omp for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
      const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
      F dw[kColBlock] = {};
      for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        const F* d = dout + (size_t)n * C;
        const F s = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) dw[c - c0] += d[c] * (x[c] * s);
      }
      for (int c = c0; c < c1; c++) dweight[c] += dw[c - c0];
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void rmsnorm_forward<F>(F*, F*, const F*, const F*, int, int, double);                 \
  template void rmsnorm_backward<F>(F*, F*, const F*, const F*, const F*, const F*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
