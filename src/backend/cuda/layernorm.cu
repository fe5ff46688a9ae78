// LayerNorm over the last dimension, as torch.nn.LayerNorm(C) with eps = 1e-5; twin of
// layernorm.cpp.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kThreads = 256;            // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kThreads / kWarp;

// One warp per row: lanes stride the row in packs of W, and __shfl_xor_sync sums the lanes. Two
// passes over the row (mean, then squared deviations), as the CPU twin, which keeps the variance
// exact for rows with a large mean; the row stays in L1 between passes. fp32 sums: a row is at
// most a few thousand terms, each lane sums C/32 of them and the warp tree adds the rest.
template <typename F, int W>
__global__ void layernorm_forward_kernel(F* out, float* mean, float* rstd, const F* inp,
                                         const F* weight, const F* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below stay full
  const F* x = inp + size_t(row) * C;
  float sum = 0.0f;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
#pragma unroll
    for (int k = 0; k < W; k++) sum += to_float(p.v[k]);
  }
  const float m = warp_sum(sum) / float(C);
  float var = 0.0f;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float d = to_float(p.v[k]) - m;
      var += d * d;
    }
  }
  // 1/sqrtf, not rsqrtf: the approximate reciprocal square root costs the 1e-5 parity.
  const float s = 1.0f / sqrtf(warp_sum(var) / float(C) + kEps);
  F* o = out + size_t(row) * C;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
    const Pack<F, W> w = load_pack<F, W>(weight + c);
    const Pack<F, W> b = load_pack<F, W>(bias + c);
    Pack<F, W> y;
#pragma unroll
    for (int k = 0; k < W; k++)
      y.v[k] = from_float<F>((to_float(p.v[k]) - m) * s * to_float(w.v[k]) + to_float(b.v[k]));
    store_pack<F, W>(o + c, y);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp (N,C) += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout: row-local, one
// warp per row as in the forward.
template <typename F, int W>
__global__ void layernorm_backward_dinp_kernel(F* dinp, const F* dout, const F* inp,
                                               const F* weight, const float* mean,
                                               const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const F* x = inp + size_t(row) * C;
  const F* d = dout + size_t(row) * C;
  const float m = mean[row], s = rstd[row];
  float gsum = 0.0f, gxsum = 0.0f;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> xp = load_pack<F, W>(x + c);
    const Pack<F, W> dp = load_pack<F, W>(d + c);
    const Pack<F, W> wp = load_pack<F, W>(weight + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float g = to_float(wp.v[k]) * to_float(dp.v[k]);
      gsum += g;
      gxsum += g * ((to_float(xp.v[k]) - m) * s);
    }
  }
  const float gmean = warp_sum(gsum) / float(C), gxmean = warp_sum(gxsum) / float(C);
  F* di = dinp + size_t(row) * C;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> xp = load_pack<F, W>(x + c);
    const Pack<F, W> dp = load_pack<F, W>(d + c);
    const Pack<F, W> wp = load_pack<F, W>(weight + c);
    Pack<F, W> acc = load_pack<F, W>(di + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float xhat = (to_float(xp.v[k]) - m) * s;
      const float g = to_float(wp.v[k]) * to_float(dp.v[k]);
      acc.v[k] = from_float<F>(to_float(acc.v[k]) + s * (g - gmean - xhat * gxmean));
    }
    store_pack<F, W>(di + c, acc);
  }
}

// Pass 1 of dweight (C) += Σ_rows dout * xhat and dbias (C) += Σ_rows dout (common.cuh's
// ColumnSplit): block (x, y) sums rows [y * per, (y + 1) * per) of columns [32x, 32x + 32);
// thread (x,y) takes every 32nd of those rows in one column (coalesced: a warp reads 32 adjacent
// columns of one row), then a column's 32 partials are added in order. The weight's partials go
// to partial[chunk * C + col], the bias's C * chunks further on.
template <typename F>
__global__ void layernorm_backward_params_kernel(float* partial, const F* dout, const F* inp,
                                                 const float* mean, const float* rstd, int N,
                                                 int C, int per) {
  TESSERA_SHARED(float, pw, [kWarp][kWarp + 1]);
  TESSERA_SHARED(float, pb, [kWarp][kWarp + 1]);
  const int col = blockIdx.x * kWarp + threadIdx.x;
  const int begin = blockIdx.y * per, end = begin + per < N ? begin + per : N;
  float sw = 0.0f, sb = 0.0f;
  if (col < C) {
    for (int n = begin + threadIdx.y; n < end; n += kWarp) {
      const size_t at = size_t(n) * C + col;
      const float d = to_float(dout[at]);
      sw += d * ((to_float(inp[at]) - mean[n]) * rstd[n]);
      sb += d;
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || col >= C) return;
  float tw = 0.0f, tb = 0.0f;
  for (int y = 0; y < kWarp; y++) {
    tw += pw[y][threadIdx.x];
    tb += pb[y][threadIdx.x];
  }
  partial[size_t(blockIdx.y) * C + col] = tw;
  partial[size_t(gridDim.y + blockIdx.y) * C + col] = tb;
}

}  // namespace

// out, inp (N,C); weight, bias (C); mean, rstd (N) saved for backward.
template <typename F>
void layernorm_forward(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                       const F* bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(N), kRowsPerBlock);
  if (C % W == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias))
    launch<layernorm_forward_kernel<F, W>>(grid, kThreads, 0, stream(), out, mean, rstd, inp,
                                           weight, bias, N, C);
  else
    launch<layernorm_forward_kernel<F, 1>>(grid, kThreads, 0, stream(), out, mean, rstd, inp,
                                           weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

// dout, inp (N,C); weight (C); mean, rstd (N) from the forward. Accumulates dinp (N,C),
// dweight (C), dbias (C).
template <typename F>
void layernorm_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                        const F* weight, const float* mean, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(N), kRowsPerBlock);
  if (C % W == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight))
    launch<layernorm_backward_dinp_kernel<F, W>>(grid, kThreads, 0, stream(), dinp, dout, inp,
                                                 weight, mean, rstd, N, C);
  else
    launch<layernorm_backward_dinp_kernel<F, 1>>(grid, kThreads, 0, stream(), dinp, dout, inp,
                                                 weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  const ColumnSplit split = column_split(N, C, 2);
  float* partial = column_scratch();
  launch<layernorm_backward_params_kernel<F>>(
      dim3(blocks_for(size_t(C), kWarp), unsigned(split.chunks)), dim3(kWarp, kWarp), 0, stream(),
      partial, dout, inp, mean, rstd, N, C, split.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  add_column_partials(dweight, partial, split.chunks, C);
  add_column_partials(dbias, partial + size_t(split.chunks) * C, split.chunks, C);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void layernorm_forward<F>(F*, float*, float*, const F*, const F*, const F*, int, int); \
  template void layernorm_backward<F>(F*, float*, float*, const F*, const F*, const F*,           \
                                      const float*, const float*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
