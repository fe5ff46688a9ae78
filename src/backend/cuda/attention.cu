// Causal grouped-query self-attention on a packed qkv buffer; twin of attention.cpp.
//
// The products go through cuBLAS strided-batched GEMMs over the heads of one batch row: head h's
// q, k, v are column blocks of the (T,(NH+2*NKV)*hs) rows, so heads sit a fixed number of
// elements apart (the batch stride) with the row length as leading dimension, and need no copy
// or transpose (HeadBatch below says which heads one call covers). Unlike the CPU twin, the
// products are full T x T, masked afterwards: twice the causal work, but few large GEMMs; the
// fused attention (attention_fused.cu) skips the masked half.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;

// att rows (B*NH*T of length T) hold the scaled scores on entry; each becomes the causal softmax:
// row i of a (b,h) pair over columns s <= j <= i (s: its document start, doc_start (B,T), else
// 0), exactly 0 elsewhere. One warp per row,
// lanes over packs of W columns (coalesced; W = 16 bytes when T is a multiple of it and att is
// aligned, else 1), three passes (max, sum of exp, write) so nothing but the row is stored.
template <typename F, int W>
__global__ void softmax_causal_kernel(F* att, int rows, int T, int NH, const int32_t* doc_start) {
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const int i = r % T;  // the query position: keys s..i are visible
  const int s = doc_start ? doc_start[size_t(r / (T * NH)) * T + i] : 0;
  F* row = att + size_t(r) * T;
  float mx = -INFINITY;
  for (int c = lane * W; c <= i; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k >= s && c + k <= i) mx = fmaxf(mx, to_float(p.v[k]));
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int c = lane * W; c <= i; c += kWarp * W) {
    const Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k >= s && c + k <= i) sum += expf(to_float(p.v[k]) - mx);
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int c = lane * W; c < T; c += kWarp * W) {
    Pack<F, W> p = load_pack<F, W>(row + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      p.v[k] = from_float<F>(c + k >= s && c + k <= i ? expf(to_float(p.v[k]) - mx) * inv : 0.0f);
    store_pack<F, W>(row + c, p);
  }
}

// Softmax backward in place: on entry datt holds d(att); on exit d(scores) =
// att * (datt - Σ_j att·datt) for j <= i, 0 above the diagonal, so the full products below add
// nothing from the masked half (nor, att being 0 there, from before a document start).
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
void softmax_causal(F* att, int rows, int T, int NH, const int32_t* doc_start) {
  constexpr int W = kPack<F>;
  const unsigned grid = blocks_for(size_t(rows), kRowsPerBlock);
  if (T % W == 0 && aligned16(att))
    launch<softmax_causal_kernel<F, W>>(grid, kThreads, 0, stream(), att, rows, T, NH, doc_start);
  else
    launch<softmax_causal_kernel<F, 1>>(grid, kThreads, 0, stream(), att, rows, T, NH, doc_start);
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

// Query head h = g*G + r (G = NH/NKV) reads kv head g. The members of one strided-batched GEMM
// need one stride between consecutive operands, so a call covers either the r-th query head of
// every kv head (r fixed: query heads G apart, kv heads 1 apart) or the G query heads of one kv
// head (g fixed: query heads 1 apart, the kv head broadcast with batch stride 0). Products that
// only read k and v take the longer batch (one call per batch row when G = 1, GPT-2, or
// NKV = 1); the dk and dv sums must not have two members of one call write the same kv head, so
// they take r fixed, calls r = 0, 1, ... in order: each kv head's sum over its query heads has a
// fixed order.
struct HeadBatch {
  int h0, kv0, count;   // members m < count: query head h0 + m*h_step reads kv head kv0 + m*kv_step
  int h_step, kv_step;
};

template <typename Body>
void for_head_batches(int NH, int NKV, bool writes_kv, const Body& body) {
  const int G = NH / NKV;
  if (writes_kv || NKV >= G) {
    for (int r = 0; r < G; r++) body(HeadBatch{r, 0, NKV, G, 1});
  } else {
    for (int g = 0; g < NKV; g++) body(HeadBatch{g * G, g, G, 1, 0});
  }
}

}  // namespace

// qkv (B,T,(NH+2*NKV)*hs), att (B,NH,T,T), out (B,T,NH*hs). Overwrites out and att.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int NH, int NKV, int hs,
                       const int32_t* doc_start) {
  if (B <= 0 || T <= 0) return;
  const int C3 = (NH + 2 * NKV) * hs, Cq = NH * hs;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const long long TT = (long long)T * T;
  const cudaDataType_t t = data_type<F>();
  for (int b = 0; b < B; b++) {
    const F* row = qkv + size_t(b) * T * C3;
    for_head_batches(NH, NKV, false, [&](const HeadBatch& hb) {
      // scores[h] (T,T) = scale * q_h · k_gᵀ
      gemm_strided_batched(false, true, T, T, hs, scale, row + size_t(hb.h0) * hs, C3,
                           (long long)hb.h_step * hs, row + size_t(NH + hb.kv0) * hs, C3,
                           (long long)hb.kv_step * hs, t, 0.0f,
                           att + (size_t(b) * NH + hb.h0) * TT, T, hb.h_step * TT, t, hb.count);
    });
  }
  softmax_causal(att, B * NH * T, T, NH, doc_start);
  for (int b = 0; b < B; b++) {
    const F* row = qkv + size_t(b) * T * C3;
    for_head_batches(NH, NKV, false, [&](const HeadBatch& hb) {
      // out_h (T,hs) = att_h · v_g
      gemm_strided_batched(false, false, T, hs, T, 1.0f, att + (size_t(b) * NH + hb.h0) * TT, T,
                           hb.h_step * TT, row + size_t(NH + NKV + hb.kv0) * hs, C3,
                           (long long)hb.kv_step * hs, t, 0.0f,
                           out + size_t(b) * T * Cq + size_t(hb.h0) * hs, Cq,
                           (long long)hb.h_step * hs, t, hb.count);
    });
  }
}

// dout (B,T,NH*hs), qkv and att (B,NH,T,T) from the forward. Accumulates dqkv; datt (B,NH,T,T) is
// scratch: it first holds d(att), then d(pre-softmax scores).
template <typename F>
void attention_backward(F* dqkv, F* datt, const F* dout, const F* qkv, const F* att, int B, int T,
                        int NH, int NKV, int hs) {
  if (B <= 0 || T <= 0) return;
  const int C3 = (NH + 2 * NKV) * hs, Cq = NH * hs;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const long long TT = (long long)T * T;
  const cudaDataType_t t = data_type<F>();
  for (int b = 0; b < B; b++) {
    const F* row = qkv + size_t(b) * T * C3;
    for_head_batches(NH, NKV, false, [&](const HeadBatch& hb) {
      // datt_h (T,T) = dout_h · v_gᵀ
      gemm_strided_batched(false, true, T, T, hs, 1.0f,
                           dout + size_t(b) * T * Cq + size_t(hb.h0) * hs, Cq,
                           (long long)hb.h_step * hs, row + size_t(NH + NKV + hb.kv0) * hs, C3,
                           (long long)hb.kv_step * hs, t, 0.0f,
                           datt + (size_t(b) * NH + hb.h0) * TT, T, hb.h_step * TT, t, hb.count);
    });
  }
  softmax_causal_backward(datt, att, B * NH * T, T);
  for (int b = 0; b < B; b++) {
    const F* row = qkv + size_t(b) * T * C3;
    const F* d = dout + size_t(b) * T * Cq;
    F* drow = dqkv + size_t(b) * T * C3;
    const F* a = att + size_t(b) * NH * TT;
    const F* da = datt + size_t(b) * NH * TT;
    for_head_batches(NH, NKV, false, [&](const HeadBatch& hb) {
      // dq_h += scale * dscores_h · k_g
      gemm_strided_batched(false, false, T, hs, T, scale, da + hb.h0 * TT, T, hb.h_step * TT,
                           row + size_t(NH + hb.kv0) * hs, C3, (long long)hb.kv_step * hs, t,
                           1.0f, drow + size_t(hb.h0) * hs, C3, (long long)hb.h_step * hs, t,
                           hb.count);
    });
    for_head_batches(NH, NKV, true, [&](const HeadBatch& hb) {
      // dk_g += scale * dscores_hᵀ · q_h
      gemm_strided_batched(true, false, T, hs, T, scale, da + hb.h0 * TT, T, hb.h_step * TT,
                           row + size_t(hb.h0) * hs, C3, (long long)hb.h_step * hs, t, 1.0f,
                           drow + size_t(NH + hb.kv0) * hs, C3, (long long)hb.kv_step * hs, t,
                           hb.count);
      // dv_g += att_hᵀ · dout_h
      gemm_strided_batched(true, false, T, hs, T, 1.0f, a + hb.h0 * TT, T, hb.h_step * TT,
                           d + size_t(hb.h0) * hs, Cq, (long long)hb.h_step * hs, t, 1.0f,
                           drow + size_t(NH + NKV + hb.kv0) * hs, C3, (long long)hb.kv_step * hs,
                           t, hb.count);
    });
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int, int, const int32_t*);  \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int, int,    \
                                      int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
