// Context parallelism's attention blocks (model/context_attention.hpp), twin of
// attention_block.cpp: the queries of one chunk of positions against the keys and values of
// another, on the fused attention's tiles (flash_tiles.cuh) but with the block's own strides
// (backend/attention_block.hpp), so the queries stay in qkv's rows and the keys and values in
// the packed K/V block that travels round the ring.
//
// Forward: as flash_forward_kernel (attention_fused.cu), a block of kBr query rows of one (b,h)
// walks the key tiles (on a diagonal block those at or below its last row, otherwise all of them)
// with an online softmax; at the end each row's block output and log-sum-exp c merge into the
// running out and lse (a): new = log(e^a + e^c), out = out e^(a - new) + block e^(c - new). The
// first block finds a = -inf and out = 0 and just writes its own.
//
// Backward: the fused backward's two kernels (one writer per output element, a fixed order of
// additions, no atomics), reading D from delta (attention_delta, the rows' dout · out of the whole
// attention, computed once before the blocks) instead of recomputing it per tile: block_dkdv
// takes 32 keys of one kv head and walks the block's query rows of each of the kv head's query
// heads in turn; block_dq takes a tile of query rows and walks the key tiles.
#include <cmath>

#include "backend/cuda/flash_tiles.cuh"

namespace tessera::cuda {

namespace {

using namespace flash;

// Key `key` is visible to query row i (of sequence b) of a block of T rows: a real key, on a
// diagonal block at or before the query, and under a document mask at or after the start of the
// query's document.
__device__ inline bool visible(const AttentionBlock& s, int b, int i, int key) {
  return key < s.rows && (!s.diagonal || key <= i) &&
         (!s.q_start || s.k_pos + key >= s.q_start[size_t(b) * s.bstart + i]);
}

// The last key a tile of query rows [q0, q0 + rows) sees.
__device__ inline int last_key(const AttentionBlock& s, int q0, int rows) {
  const int last_row = (s.rows < q0 + rows ? s.rows : q0 + rows) - 1;
  return s.diagonal ? last_row : s.rows - 1;
}

// grid (ceil(rows / kBr), B * NH), kThreads threads.
template <typename F, int Dmax>
__global__ void block_forward_kernel(F* out, float* lse, const F* q, const F* kv,
                                     AttentionBlock s, float scale) {
  constexpr int R = kRowsPerWarp<Dmax>, kBr = kWarps * R, kDims = Dmax / kWarp;
  TESSERA_SHARED(float, qs, [kBr][Dmax]);
  TESSERA_SHARED(float, ks, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, vs, [kBc][Dmax]);
  TESSERA_SHARED(float, ps, [kBr][kBc]);
  const int hs = s.hs, T = s.rows;
  const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH, g = h / (s.NH / s.NKV);
  const int q0 = blockIdx.x * kBr;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const F* k = kv + b * s.bkv + size_t(g) * hs;
  const F* v = k + size_t(s.NKV) * hs;
  load_tile<F, kBr, Dmax>(qs, q + b * s.bq + size_t(h) * hs, q0, T, hs, s.ldq);

  float m[R], l[R], o[R][kDims];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDims; c++) o[r][c] = 0.0f;
  }
  const int last = last_key(s, q0, kBr);
  for (int k0 = 0; k0 <= last; k0 += kBc) {
    __syncthreads();  // the previous tile's readers are done (and, first, qs is complete)
    load_tile<F, kBc, Dmax + 1>(ks, k, k0, T, hs, s.ldkv);
    load_tile<F, kBc, Dmax>(vs, v, k0, T, hs, s.ldkv);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T) break;  // the same for every lane of the warp
      online_softmax_tile<Dmax>(m[r], l[r], o[r], ps[row], qs[row], ks, vs,
                                visible(s, b, i, k0 + lane), scale, hs);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    if (i >= T) break;
    if (l[r] == 0.0f) continue;  // the row's document starts after this block: nothing to merge
    float* row_lse = lse + (size_t(b) * s.NH + h) * s.t_lse + i;
    F* y = out + b * s.bo + size_t(i) * s.ldo + size_t(h) * hs;
    const float a = *row_lse, c = m[r] + logf(l[r]);
    const float top = fmaxf(a, c);
    const float wa = expf(a - top), wc = expf(c - top), total = wa + wc;
    const float fa = wa / total, fc = wc / total / l[r];
#pragma unroll
    for (int k2 = 0; k2 < kDims; k2++) {
      const int d = lane + k2 * kWarp;
      if (d < hs) y[d] = from_float<F>(to_float(y[d]) * fa + o[r][k2] * fc);
    }
    __syncwarp();  // every lane has read the old lse before lane 0 replaces it
    if (lane == 0) *row_lse = top + logf(total);
  }
}

// grid (ceil(B * NH * T / 8), 1), 256 threads: a warp per row, lanes over its dimensions.
template <typename F>
__global__ void delta_kernel(float* delta, const F* dout, const F* out, int B, int T, int NH,
                             int hs, int ldo) {
  const size_t row = blockIdx.x * size_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= size_t(B) * NH * T) return;  // the same for every lane of the warp
  const size_t t = row % T, h = row / T % NH, b = row / (size_t(T) * NH);
  const size_t at = (b * T + t) * ldo + h * hs;
  float dot = 0.0f;
  for (int d = lane; d < hs; d += kWarp) dot += to_float(dout[at + d]) * to_float(out[at + d]);
  dot = warp_sum(dot);
  if (lane == 0) delta[row] = dot;
}

// grid (ceil(rows / kBc), B * NKV), kThreads threads: dK and dV of one tile of 32 keys of one kv
// head, summed over its query heads in order. Warp w owns keys 8w .. 8w + 7 of the tile, lane its
// dimensions.
template <typename F, int Dmax>
__global__ void block_dkdv_kernel(F* dkv, const F* dout, const float* delta, const F* q,
                                  const F* kv, const float* lse, AttentionBlock s, float scale) {
  constexpr int kBq = kWarps * kRowsPerWarp<Dmax>, kDims = Dmax / kWarp;
  constexpr int kKeysPerWarp = kBc / kWarps;
  TESSERA_SHARED(float, ks, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, vs, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, qs, [kBq][Dmax]);
  TESSERA_SHARED(float, dos, [kBq][Dmax]);
  TESSERA_SHARED(float, ps, [kBq][kBc]);
  TESSERA_SHARED(float, dss, [kBq][kBc]);
  TESSERA_SHARED(float, lses, [kBq]);
  TESSERA_SHARED(float, Ds, [kBq]);
  const int hs = s.hs, T = s.rows, G = s.NH / s.NKV;
  const int bg = blockIdx.y, b = bg / s.NKV, g = bg % s.NKV;
  const int k0 = blockIdx.x * kBc;
  const size_t kat = b * s.bkv + size_t(g) * hs, vat = kat + size_t(s.NKV) * hs;
  load_tile<F, kBc, Dmax + 1>(ks, kv + kat, k0, T, hs, s.ldkv);
  load_tile<F, kBc, Dmax + 1>(vs, kv + vat, k0, T, hs, s.ldkv);

  float dk[kKeysPerWarp][kDims], dv[kKeysPerWarp][kDims];
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; j++)
#pragma unroll
    for (int c = 0; c < kDims; c++) dk[j][c] = dv[j][c] = 0.0f;

  for (int h = g * G; h < (g + 1) * G; h++) {
    const F* qh = q + b * s.bq + size_t(h) * hs;
    const F* dh = dout + b * s.bo + size_t(h) * hs;
    const size_t at = (size_t(b) * s.NH + h) * s.t_lse;
    // On a diagonal block, query rows below k0 see none of these keys.
    for (int i0 = s.diagonal ? k0 / kBq * kBq : 0; i0 < T; i0 += kBq) {
      __syncthreads();  // the previous rows' readers are done (and, first, ks and vs are complete)
      load_tile<F, kBq, Dmax>(qs, qh, i0, T, hs, s.ldq);
      load_tile<F, kBq, Dmax>(dos, dh, i0, T, hs, s.ldo);
      for (int r = threadIdx.x; r < kBq; r += kThreads) {
        lses[r] = i0 + r < T ? lse[at + i0 + r] : 0.0f;
        Ds[r] = i0 + r < T ? delta[at + i0 + r] : 0.0f;
      }
      __syncthreads();
      score_gradients_block<kBq, Dmax>(ps, dss, qs, dos, ks, vs, lses, Ds, i0, k0, T, scale, hs,
                                       [&](int i, int key) { return visible(s, b, i, key); });
      __syncthreads();
      accumulate_dkdv<kBq, Dmax, kKeysPerWarp>(dk, dv, ps, dss, qs, dos);
    }
  }
  add_key_gradients<F, Dmax, kKeysPerWarp>(dkv + kat, dkv + vat, s.ldkv, k0, T, hs, scale, dk,
                                           dv);
}

// grid (ceil(rows / kBr), B * NH), kThreads threads: dQ of one tile of query rows.
template <typename F, int Dmax>
__global__ void block_dq_kernel(F* dq, const F* dout, const float* delta, const F* q,
                                const F* kv, const float* lse, AttentionBlock s, float scale) {
  constexpr int R = kRowsPerWarp<Dmax>, kBr = kWarps * R, kDims = Dmax / kWarp;
  TESSERA_SHARED(float, qs, [kBr][Dmax]);
  TESSERA_SHARED(float, dos, [kBr][Dmax]);
  TESSERA_SHARED(float, ks, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, vs, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, dss, [kBr][kBc]);
  const int hs = s.hs, T = s.rows;
  const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH, g = h / (s.NH / s.NKV);
  const int q0 = blockIdx.x * kBr;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const F* k = kv + b * s.bkv + size_t(g) * hs;
  const F* v = k + size_t(s.NKV) * hs;
  const size_t at = (size_t(b) * s.NH + h) * s.t_lse;
  load_tile<F, kBr, Dmax>(qs, q + b * s.bq + size_t(h) * hs, q0, T, hs, s.ldq);
  load_tile<F, kBr, Dmax>(dos, dout + b * s.bo + size_t(h) * hs, q0, T, hs, s.ldo);

  float lse_r[R], D_r[R], acc_q[R][kDims];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    lse_r[r] = i < T ? lse[at + i] : 0.0f;
    D_r[r] = i < T ? delta[at + i] : 0.0f;
#pragma unroll
    for (int c = 0; c < kDims; c++) acc_q[r][c] = 0.0f;
  }
  const int last = last_key(s, q0, kBr);
  for (int k0 = 0; k0 <= last; k0 += kBc) {
    __syncthreads();
    load_tile<F, kBc, Dmax + 1>(ks, k, k0, T, hs, s.ldkv);
    load_tile<F, kBc, Dmax + 1>(vs, v, k0, T, hs, s.ldkv);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T) break;  // the same for every lane of the warp
      float p, ds = 0.0f;
      if (visible(s, b, i, k0 + lane))
        ds = score_gradient<Dmax>(qs[row], dos[row], ks, vs, lse_r[r], D_r[r], scale, hs, &p);
      accumulate_dq<Dmax>(acc_q[r], dss[row], ds, ks);
    }
  }
  add_query_gradients<F, Dmax, R>(dq + b * s.bq + size_t(h) * hs, s.ldq, q0, T, hs, scale, acc_q);
}

}  // namespace

template <typename F>
void attention_block_forward(F* out, float* lse, const F* q, const F* kv, const AttentionBlock& s) {
  if (s.B <= 0 || s.rows <= 0) return;
  const float scale = float(1.0 / std::sqrt(double(s.hs)));
  with_head_tile(s.hs, [&]<int Dmax>() {
    const dim3 grid(row_tiles<Dmax>(s.rows), unsigned(s.B * s.NH));
    launch<block_forward_kernel<F, Dmax>>(grid, kThreads, 0, stream(), out, lse, q, kv, s, scale);
  });
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void attention_delta(float* delta, const F* dout, const F* out, int B, int T, int NH, int hs,
                     int ldo) {
  if (B <= 0 || T <= 0) return;
  constexpr int kRowThreads = 256;
  launch<delta_kernel<F>>(blocks_for(size_t(B) * NH * T, kRowThreads / kWarp), kRowThreads, 0,
                          stream(), delta, dout, out, B, T, NH, hs, ldo);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void attention_block_backward(F* dq, F* dkv, const F* dout, const float* delta, const F* q,
                              const F* kv, const float* lse, const AttentionBlock& s) {
  if (s.B <= 0 || s.rows <= 0) return;
  const float scale = float(1.0 / std::sqrt(double(s.hs)));
  with_head_tile(s.hs, [&]<int Dmax>() {
    const dim3 key_grid(blocks_for(size_t(s.rows), kBc), unsigned(s.B * s.NKV));
    launch<block_dkdv_kernel<F, Dmax>>(key_grid, kThreads, 0, stream(), dkv, dout, delta, q, kv,
                                       lse, s, scale);
    CUDA_CHECK_LAUNCH();
    const dim3 row_grid(row_tiles<Dmax>(s.rows), unsigned(s.B * s.NH));
    launch<block_dq_kernel<F, Dmax>>(row_grid, kThreads, 0, stream(), dq, dout, delta, q, kv, lse,
                                     s, scale);
  });
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_block_forward<F>(F*, float*, const F*, const F*, const AttentionBlock&); \
  template void attention_delta<F>(float*, const F*, const F*, int, int, int, int, int);          \
  template void attention_block_backward<F>(F*, F*, const F*, const float*, const F*, const F*,    \
                                            const float*, const AttentionBlock&);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
