// RMSNorm over the last dimension, as LLaMA's (torch: x * rsqrt(mean(x²) + eps) * weight), and
// over each q and k head (model.qk_norm); twin of rmsnorm.cpp. Laid out as layernorm.cu: one warp per row, and the weight gradient through
// the two-pass column sums of common.cuh.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kThreads / kWarp;

// One warp per row: lanes stride the row in packs of W, and __shfl_xor_sync sums the lanes.
template <typename F, int W>
__global__ void rmsnorm_forward_kernel(F* out, float* rstd, const F* inp, const F* weight, int N,
                                       int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below stay full
  const F* x = inp + size_t(row) * C;
  float ss = 0.0f;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
#pragma unroll
    for (int k = 0; k < W; k++) ss += to_float(p.v[k]) * to_float(p.v[k]);
  }
  // 1/sqrtf, not rsqrtf: the approximate reciprocal square root costs the 1e-5 parity.
  const float s = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
  F* o = out + size_t(row) * C;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
    const Pack<F, W> w = load_pack<F, W>(weight + c);
    Pack<F, W> y;
#pragma unroll
    for (int k = 0; k < W; k++) y.v[k] = from_float<F>(to_float(p.v[k]) * s * to_float(w.v[k]));
    store_pack<F, W>(o + c, y);
  }
  if (lane == 0) rstd[row] = s;
}

// dinp (N,C) += rstd * (g - xhat * mean(g * xhat)), g = weight * dout, xhat = x * rstd:
// row-local, one warp per row as in the forward.
template <typename F, int W>
__global__ void rmsnorm_backward_dinp_kernel(F* dinp, const F* dout, const F* inp, const F* weight,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const F* x = inp + size_t(row) * C;
  const F* d = dout + size_t(row) * C;
  const float s = rstd[row];
  float gxsum = 0.0f;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> xp = load_pack<F, W>(x + c);
    const Pack<F, W> dp = load_pack<F, W>(d + c);
    const Pack<F, W> wp = load_pack<F, W>(weight + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      gxsum += to_float(wp.v[k]) * to_float(dp.v[k]) * (to_float(xp.v[k]) * s);
  }
  const float gxmean = warp_sum(gxsum) / float(C);
  F* di = dinp + size_t(row) * C;
  for (int c = lane * W; c < C; c += kWarp * W) {
    const Pack<F, W> xp = load_pack<F, W>(x + c);
    const Pack<F, W> dp = load_pack<F, W>(d + c);
    const Pack<F, W> wp = load_pack<F, W>(weight + c);
    Pack<F, W> acc = load_pack<F, W>(di + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float g = to_float(wp.v[k]) * to_float(dp.v[k]);
      acc.v[k] = from_float<F>(to_float(acc.v[k]) + s * (g - to_float(xp.v[k]) * s * gxmean));
    }
    store_pack<F, W>(di + c, acc);
  }
}

// Pass 1 of dweight (C) += Σ_rows dout * xhat (common.cuh's ColumnSplit), as
// layernorm_backward_params_kernel: block (x, y) sums rows [y * per, (y + 1) * per) of columns
// [32x, 32x + 32), thread (x,y) every 32nd of those rows in one column, then a column's 32
// partials are added in order into partial[chunk * C + col].
template <typename F>
__global__ void rmsnorm_backward_weight_kernel(float* partial, const F* dout, const F* inp,
                                               const float* rstd, int N, int C, int per) {
  TESSERA_SHARED(float, pw, [kWarp][kWarp + 1]);
  const int col = blockIdx.x * kWarp + threadIdx.x;
  const int begin = blockIdx.y * per, end = begin + per < N ? begin + per : N;
  float sw = 0.0f;
  if (col < C) {
    for (int n = begin + threadIdx.y; n < end; n += kWarp) {
      const size_t at = size_t(n) * C + col;
      sw += to_float(dout[at]) * (to_float(inp[at]) * rstd[n]);
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  __syncthreads();
  if (threadIdx.y != 0 || col >= C) return;
  float tw = 0.0f;
  for (int y = 0; y < kWarp; y++) tw += pw[y][threadIdx.x];
  partial[size_t(blockIdx.y) * C + col] = tw;
}

// model.qk_norm: one warp per item, a (row, q or k head) of qkv, in place; head j of row n at
// qkv + n*(NH + 2*NKV)*hs + j*hs, its raw copy at raw + (n*(NH + NKV) + j)*hs = raw + item*hs,
// its weight the q half (j < NH) or the k half of weight (2 hs). Each lane reads and writes its
// own elements.
struct QkHead {
  size_t item;    // n*(NH + NKV) + j: the raw copy's and rstd's index
  size_t at;      // the head's first element in qkv
  int weight_at;  // 0 (a q head) or hs (a k head)
};
// This warp's item; false past the last (the whole warp leaves together).
__device__ __forceinline__ bool qk_head(QkHead* h, int N, int NH, int NKV, int hs) {
  const int heads = NH + NKV;
  h->item = blockIdx.x * size_t(kRowsPerBlock) + threadIdx.x / kWarp;
  if (h->item >= size_t(N) * heads) return false;
  const int j = int(h->item % heads);
  h->at = h->item / heads * (NH + 2 * NKV) * hs + size_t(j) * hs;
  h->weight_at = j < NH ? 0 : hs;
  return true;
}

template <typename F>
__global__ void qk_norm_forward_kernel(F* qkv, F* raw, float* rstd, const F* weight, int N, int NH,
                                       int NKV, int hs, float eps) {
  QkHead h;
  if (!qk_head(&h, N, NH, NKV, hs)) return;
  const int lane = threadIdx.x % kWarp;
  F* x = qkv + h.at;
  F* r = raw + h.item * hs;
  const F* w = weight + h.weight_at;
  const size_t item = h.item;
  float ss = 0.0f;
  for (int c = lane; c < hs; c += kWarp) ss += to_float(x[c]) * to_float(x[c]);
  const float s = 1.0f / sqrtf(warp_sum(ss) / float(hs) + eps);
  for (int c = lane; c < hs; c += kWarp) {
    const F v = x[c];
    r[c] = v;
    x[c] = from_float<F>(to_float(v) * s * to_float(w[c]));
  }
  if (lane == 0) rstd[item] = s;
}

// d(raw) = rstd * (g - xhat * mean(g * xhat)), g = w * d(normalised), in place on dqkv.
template <typename F>
__global__ void qk_norm_backward_dinp_kernel(F* dqkv, const F* raw, const F* weight,
                                             const float* rstd, int N, int NH, int NKV, int hs) {
  QkHead h;
  if (!qk_head(&h, N, NH, NKV, hs)) return;
  const int lane = threadIdx.x % kWarp;
  F* d = dqkv + h.at;
  const F* x = raw + h.item * hs;
  const F* w = weight + h.weight_at;
  const float s = rstd[h.item];
  float gxsum = 0.0f;
  for (int c = lane; c < hs; c += kWarp)
    gxsum += to_float(w[c]) * to_float(d[c]) * (to_float(x[c]) * s);
  const float gxmean = warp_sum(gxsum) / float(hs);
  for (int c = lane; c < hs; c += kWarp) {
    const float g = to_float(w[c]) * to_float(d[c]);
    d[c] = from_float<F>(s * (g - to_float(x[c]) * s * gxmean));
  }
}

// Pass 1 of the weight gradient of one part (the q heads j0 = 0, or the k heads j0 = NH; `part`
// of them): its rows m = n*part + (j - j0) summed by column, as rmsnorm_backward_weight_kernel.
template <typename F>
__global__ void qk_norm_backward_weight_kernel(float* partial, const F* dqkv, const F* raw,
                                               const float* rstd, int rows, int NH, int NKV, int hs,
                                               int j0, int part, int per) {
  TESSERA_SHARED(float, pw, [kWarp][kWarp + 1]);
  const int heads = NH + NKV;
  const int col = blockIdx.x * kWarp + threadIdx.x;
  const int begin = blockIdx.y * per, end = begin + per < rows ? begin + per : rows;
  float sw = 0.0f;
  if (col < hs) {
    for (int m = begin + threadIdx.y; m < end; m += kWarp) {
      const size_t n = size_t(m / part), item = n * heads + size_t(j0 + m % part);
      const size_t at = n * (NH + 2 * NKV) * hs + size_t(j0 + m % part) * hs + col;
      sw += to_float(dqkv[at]) * (to_float(raw[item * hs + col]) * rstd[item]);
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  __syncthreads();
  if (threadIdx.y != 0 || col >= hs) return;
  float tw = 0.0f;
  for (int y = 0; y < kWarp; y++) tw += pw[y][threadIdx.x];
  partial[size_t(blockIdx.y) * hs + col] = tw;
}

}  // namespace

// model.qk_norm's per-head norm of q and k (cpu::qk_norm_forward states it).
template <typename F>
void qk_norm_forward(F* qkv, F* raw, float* rstd, const F* weight, int N, int NH, int NKV, int hs,
                     double eps) {
  const size_t items = size_t(N) * (NH + NKV);
  if (items == 0 || hs <= 0) return;
  launch<qk_norm_forward_kernel<F>>(blocks_for(items, kRowsPerBlock), kThreads, 0, stream(), qkv,
                                    raw, rstd, weight, N, NH, NKV, hs, float(eps));
  CUDA_CHECK_LAUNCH();
}

// The weight gradient first (it reads d(normalised)), the q part then the k part, each in two
// passes through the column scratch; then d(raw) in place.
template <typename F>
void qk_norm_backward(F* dqkv, float* dweight, const F* raw, const F* weight, const float* rstd,
                      int N, int NH, int NKV, int hs) {
  const size_t items = size_t(N) * (NH + NKV);
  if (items == 0 || hs <= 0) return;
  for (int k = 0; k < 2; k++) {
    const int j0 = k == 0 ? 0 : NH, part = k == 0 ? NH : NKV, rows = N * part;
    const ColumnSplit split = column_split(rows, hs, 1);
    launch<qk_norm_backward_weight_kernel<F>>(
        dim3(blocks_for(size_t(hs), kWarp), unsigned(split.chunks)), dim3(kWarp, kWarp), 0,
        stream(), column_scratch(), dqkv, raw, rstd, rows, NH, NKV, hs, j0, part,
        split.rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    add_column_partials(dweight + size_t(k) * hs, column_scratch(), split.chunks, hs);
  }
  launch<qk_norm_backward_dinp_kernel<F>>(blocks_for(items, kRowsPerBlock), kThreads, 0, stream(),
                                          dqkv, raw, weight, rstd, N, NH, NKV, hs);
  CUDA_CHECK_LAUNCH();
}

// out, inp (N,C); weight (C); rstd (N) saved for backward.
template <typename F>
void rmsnorm_forward(F* out, float* rstd, const F* inp, const F* weight, int N, int C, double eps) {
  if (N <= 0 || C <= 0) return;
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(N), kRowsPerBlock);
  if (C % W == 0 && aligned16(out) && aligned16(inp) && aligned16(weight))
    launch<rmsnorm_forward_kernel<F, W>>(grid, kThreads, 0, stream(), out, rstd, inp, weight, N, C,
                                         float(eps));
  else
    launch<rmsnorm_forward_kernel<F, 1>>(grid, kThreads, 0, stream(), out, rstd, inp, weight, N, C,
                                         float(eps));
  CUDA_CHECK_LAUNCH();
}

// dout, inp (N,C); weight (C); rstd (N) from the forward. Accumulates dinp (N,C), dweight (C).
template <typename F>
void rmsnorm_backward(F* dinp, float* dweight, const F* dout, const F* inp, const F* weight,
                      const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(N), kRowsPerBlock);
  if (C % W == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight))
    launch<rmsnorm_backward_dinp_kernel<F, W>>(grid, kThreads, 0, stream(), dinp, dout, inp,
                                               weight, rstd, N, C);
  else
    launch<rmsnorm_backward_dinp_kernel<F, 1>>(grid, kThreads, 0, stream(), dinp, dout, inp,
                                               weight, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  const ColumnSplit split = column_split(N, C, 1);
  launch<rmsnorm_backward_weight_kernel<F>>(
      dim3(blocks_for(size_t(C), kWarp), unsigned(split.chunks)), dim3(kWarp, kWarp), 0, stream(),
      column_scratch(), dout, inp, rstd, N, C, split.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  add_column_partials(dweight, column_scratch(), split.chunks, C);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void rmsnorm_forward<F>(F*, float*, const F*, const F*, int, int, double);             \
  template void rmsnorm_backward<F>(F*, float*, const F*, const F*, const F*, const float*, int,   \
                                    int);                                                          \
  template void qk_norm_forward<F>(F*, F*, float*, const F*, int, int, int, int, double);         \
  template void qk_norm_backward<F>(F*, float*, const F*, const F*, const float*, int, int, int,   \
                                    int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
