// RMSNorm over the last dimension, as LLaMA's (torch: x * rsqrt(mean(x²) + eps) * weight), and
// over each q and k head (model.qk_norm); twin of rmsnorm.cu.
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

// Per-head q and k (model.qk_norm): rows of hs within the packed qkv, the same arithmetic as above.
// Head j < NH + NKV of row n is at qkv + n*(NH + 2*NKV)*hs + j*hs, its raw copy at
// raw + (n*(NH + NKV) + j)*hs, its weight the q half (j < NH) or the k half of weight (2 hs).
template <typename F>
void qk_norm_forward(F* qkv, F* raw, F* rstd, const F* weight, int N, int NH, int NKV, int hs,
                     double eps) {
  const int heads = NH + NKV;
  const size_t row_len = (size_t)(NH + 2 * NKV) * hs;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    for (int j = 0; j < heads; j++) {
      F* x = qkv + n * row_len + (size_t)j * hs;
      F* r = raw + ((size_t)n * heads + j) * hs;
      const F* w = weight + (j < NH ? 0 : hs);
      double ss = 0.0;
#pragma omp simd reduction(+ : ss)
      for (int c = 0; c < hs; c++) ss += (double)x[c] * x[c];
      const F s = F(1.0 / std::sqrt(ss / hs + eps));
#pragma omp simd
      for (int c = 0; c < hs; c++) {
        r[c] = x[c];
        x[c] = x[c] * s * w[c];
      }
      rstd[(size_t)n * heads + j] = s;
    }
  }
}

// dweight first (it reads d(normalised)), by column blocks of the 2 hs weights as above, each
// summing its q (or k) heads' rows in order; then each head's d(raw) replaces its d(normalised).
template <typename F>
void qk_norm_backward(F* dqkv, F* dweight, const F* raw, const F* weight, const F* rstd, int N,
                      int NH, int NKV, int hs) {
  const int heads = NH + NKV;
  const size_t row_len = (size_t)(NH + 2 * NKV) * hs;
  const int per_part = (hs + kColBlock - 1) / kColBlock;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int blk = 0; blk < 2 * per_part; blk++) {
      const bool k = blk >= per_part;
      const int c0 = (blk % per_part) * kColBlock, c1 = std::min(hs, c0 + kColBlock);
      const int j0 = k ? NH : 0, j1 = k ? heads : NH;
      F dw[kColBlock] = {};
      for (int n = 0; n < N; n++) {
        for (int j = j0; j < j1; j++) {
          const F* d = dqkv + n * row_len + (size_t)j * hs;
          const F* x = raw + ((size_t)n * heads + j) * hs;
          const F s = rstd[(size_t)n * heads + j];
#pragma omp simd
          for (int c = c0; c < c1; c++) dw[c - c0] += d[c] * (x[c] * s);
        }
      }
      F* out = dweight + (k ? hs : 0);
      for (int c = c0; c < c1; c++) out[c] += dw[c - c0];
    }
    // (the implicit barrier of the loop above: every d(normalised) read before any is replaced)
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < heads; j++) {
        F* d = dqkv + n * row_len + (size_t)j * hs;
        const F* x = raw + ((size_t)n * heads + j) * hs;
        const F* w = weight + (j < NH ? 0 : hs);
        const F s = rstd[(size_t)n * heads + j];
        double gxsum = 0.0;
#pragma omp simd reduction(+ : gxsum)
        for (int c = 0; c < hs; c++) gxsum += w[c] * d[c] * (x[c] * s);
        const F gxmean = F(gxsum / hs);
#pragma omp simd
        for (int c = 0; c < hs; c++) d[c] = s * (w[c] * d[c] - (x[c] * s) * gxmean);
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void rmsnorm_forward<F>(F*, F*, const F*, const F*, int, int, double);                 \
  template void rmsnorm_backward<F>(F*, F*, const F*, const F*, const F*, const F*, int, int);    \
  template void qk_norm_forward<F>(F*, F*, F*, const F*, int, int, int, int, double);             \
  template void qk_norm_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
