// LayerNorm over the last dimension, as torch.nn.LayerNorm(C) with eps = 1e-5.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

static constexpr double kEps = 1e-5;
static constexpr int kColBlock = 64;

// out, inp (N,C); weight, bias (C); mean, rstd (N) saved for backward.
// Row statistics are summed in double: two passes (mean, then squared deviations) and a wide
// accumulator keep fp32 close to torch for rows with a large mean.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                       int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    const double m = sum / C;
    double var = 0.0;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    const F mf = F(m), s = F(1.0 / std::sqrt(var / C + kEps));
    F* o = out + (size_t)n * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * s * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = s;
  }
}

// dout, inp (N,C); weight (C); mean, rstd (N) from the forward. Accumulates dinp (N,C),
// dweight (C), dbias (C).
// dinp is row-local, so rows go to threads; dweight and dbias reduce over rows, so columns go to
// threads, each summing its columns over all rows in order (no race, order fixed).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                        const F* mean, const F* rstd, int N, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; n++) {
      const F* x = inp + (size_t)n * C;
      const F* d = dout + (size_t)n * C;
      const F m = mean[n], s = rstd[n];
      // dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout
      double gsum = 0.0, gxsum = 0.0;
#pragma omp simd reduction(+ : gsum, gxsum)
      for (int c = 0; c < C; c++) {
        const F g = weight[c] * d[c];
        gsum += g;
        gxsum += g * ((x[c] - m) * s);
      }
      const F gmean = F(gsum / C), gxmean = F(gxsum / C);
      F* di = dinp + (size_t)n * C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const F xhat = (x[c] - m) * s;
        di[c] += s * (weight[c] * d[c] - gmean - xhat * gxmean);
      }
    }
#pragma omp for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
      const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
      F dw[kColBlock] = {}, db[kColBlock] = {};
      for (int n = 0; n < N; n++) {
        const F* x = inp + (size_t)n * C;
        const F* d = dout + (size_t)n * C;
        const F m = mean[n], s = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) {
          dw[c - c0] += d[c] * ((x[c] - m) * s);
          db[c - c0] += d[c];
        }
      }
      for (int c = c0; c < c1; c++) {
        dweight[c] += dw[c - c0];
        dbias[c] += db[c - c0];
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);         \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*,         \
                                      const F*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
