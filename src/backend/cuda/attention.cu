// Causal multi-head self-attention on a packed qkv buffer; twin of attention.cpp.
//
// The products go through cuBLAS strided-batched GEMMs, one call per batch row over its NH heads:
// head h's q, k, v are column blocks h*hs of the (T,3C) rows, so consecutive heads sit hs
// elements apart (the batch stride) with leading dimension 3C, and need no copy or transpose.
// Unlike the CPU twin, the products are full T x T, masked afterwards: twice the causal work,
// but few large GEMMs. A fused (flash-style) kernel that skips the masked half is the follow-up.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;

// att rows (B*NH*T of length T) hold the scaled scores on entry; each becomes the causal softmax:
// row i of a (b,h) pair over columns j <= i, exactly 0 above the diagonal. One warp per row,
// lanes over packs of W columns (coalesced; W = 16 bytes when T is a multiple of it and att is
// aligned, else 1), three passes (max, sum of exp, write) so nothing but the row is stored.
template <typename F, int W>
__global__ void softmax_causal_kernel(F* att, int rows, int T) {
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;  // the query position: keys 0..i are visible
  F* row = att + size_t(r) * T;
  float mx = -INFINITY;
  for (int c = lane * W; c <= i; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k <= i) mx = fmaxf(mx, to_float(p.v[k]));
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int c = lane * W; c <= i; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k <= i) sum += expf(to_float(p.v[k]) - mx);
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int c = lane * W; c < T; c += kWarp * W) {
    Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      p.v[k] = from_float<F>(c + k <= i ? expf(to_float(p.v[k]) - mx) * inv : 0.0f);
    store_pack<F, W>(row + c, p);
  }
}

// Softmax backward in place: on entry datt holds d(att); on exit d(scores) =
// att * (datt - Σ_j att·datt) for j <= i, 0 above the diagonal, so the full products below add
// nothing from the masked half.
template <typename F, int W>
__global__ void softmax_causal_backward_kernel(F* datt, const F* att, int rows, int T) {
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;
  const F* a = att + size_t(r) * T;
  F* d = datt + size_t(r) * T;
  float dot = 0.0f;
  for (int c = lane * W; c <= i; c += kWarp * W) {
    const Pack<F, W> ap = load_pack<F, W>(a + c);
    const Pack<F, W> dp = load_pack<F, W>(d + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k <= i) dot += to_float(ap.v[k]) * to_float(dp.v[k]);
  }
  dot = warp_sum(dot);
  for (int c = lane * W; c < T; c += kWarp * W) {
    const Pack<F, W> ap = load_pack<F, W>(a + c);
    Pack<F, W> dp = load_pack<F, W>(d + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      dp.v[k] = from_float<F>(c + k <= i ? to_float(ap.v[k]) * (to_float(dp.v[k]) - dot) : 0.0f);
    store_pack<F, W>(d + c, dp);
  }
}

template <typename F>
void softmax_causal(F* att, int rows, int T) {
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(rows), kRowsPerBlock);
  if (T % W == 0 && aligned16(att))
    launch<softmax_causal_kernel<F, W>>(grid, kThreads, 0, stream(), att, rows, T);
  else
    launch<softmax_causal_kernel<F, 1>>(grid, kThreads, 0, stream(), att, rows, T);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void softmax_causal_backward(F* datt, const F* att, int rows, int T) {
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(rows), kRowsPerBlock);
  if (T % W == 0 && aligned16(datt) && aligned16(att))
    launch<softmax_causal_backward_kernel<F, W>>(grid, kThreads, 0, stream(), datt, att, rows, T);
  else
    launch<softmax_causal_backward_kernel<F, 1>>(grid, kThreads, 0, stream(), datt, att, rows, T);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// qkv (B,T,3C), att (B,NH,T,T), out (B,T,C). Overwrites out and att.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const long long TT = (long long)T * T;
  const cudaDataType_t t = data_type<F>();
  for (int b = 0; b < B; b++) {
    const F* q = qkv + size_t(b) * T * C3;
    // scores[h] (T,T) = scale * q_h · k_hᵀ
    gemm_strided_batched(false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, t, 0.0f,
                         att + size_t(b) * NH * TT, T, TT, t, NH);
  }
  softmax_causal(att, B * NH * T, T);
  for (int b = 0; b < B; b++) {
    const F* v = qkv + size_t(b) * T * C3 + 2 * C;
    // out_h (T,hs) = att_h · v_h
    gemm_strided_batched(false, false, T, hs, T, 1.0f, att + size_t(b) * NH * TT, T, TT, v, C3, hs,
                         t, 0.0f, out + size_t(b) * T * C, C, hs, t, NH);
  }
}

// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) from the forward. Accumulates dqkv (B,T,3C);
// datt (B,NH,T,T) is scratch: it first holds d(att), then d(pre-softmax scores).
template <typename F>
void attention_backward(F* dqkv, F* datt, const F* dout, const F* qkv, const F* att, int B, int T,
                        int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const long long TT = (long long)T * T;
  const cudaDataType_t t = data_type<F>();
  for (int b = 0; b < B; b++) {
    // datt_h (T,T) = dout_h · v_hᵀ
    gemm_strided_batched(false, true, T, T, hs, 1.0f, dout + size_t(b) * T * C, C, hs,
                         qkv + size_t(b) * T * C3 + 2 * C, C3, hs, t, 0.0f,
                         datt + size_t(b) * NH * TT, T, TT, t, NH);
  }
  softmax_causal_backward(datt, att, B * NH * T, T);
  for (int b = 0; b < B; b++) {
    const F* q = qkv + size_t(b) * T * C3;
    const F* k = q + C;
    const F* d = dout + size_t(b) * T * C;
    F* dq = dqkv + size_t(b) * T * C3;
    const F* a = att + size_t(b) * NH * TT;
    const F* da = datt + size_t(b) * NH * TT;
    // dq_h += scale * dscores_h · k_h
    gemm_strided_batched(false, false, T, hs, T, scale, da, T, TT, k, C3, hs, t, 1.0f, dq, C3, hs,
                         t, NH);
    // dk_h += scale * dscores_hᵀ · q_h
    gemm_strided_batched(true, false, T, hs, T, scale, da, T, TT, q, C3, hs, t, 1.0f, dq + C, C3,
                         hs, t, NH);
    // dv_h += att_hᵀ · dout_h
    gemm_strided_batched(true, false, T, hs, T, 1.0f, a, T, TT, d, C, hs, t, 1.0f, dq + 2 * C, C3,
                         hs, t, NH);
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int);                       \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
