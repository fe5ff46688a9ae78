// Causal grouped-query self-attention that keeps no T x T matrix (model.attention: fused), in
// the manner of FlashAttention-2; twin of attention_fused.cpp. Query head h reads kv head
// h / (NH/NKV) of the packed qkv rows (backend/cpu/ops.hpp gives the layout).
//
// Forward: a block takes kBr query rows of one (b,h) and walks the key tiles at or below its
// last row (the masked tiles above the diagonal are never loaded); each tile of kBc = 32 keys and
// its values sit in shared memory as fp32, lane j of a warp scores key j, and every query row
// keeps an online softmax (running max m, running sum l, output rescaled by exp(m_old - m_new)).
// The row's log-sum-exp m + log l is saved for the backward.
//
// Backward, in two kernels so that every output element has one writer and a fixed order of
// additions (no atomics: the same bits every run): flash_dkdv takes a tile of 32 keys of one kv
// head and walks the query rows at or below it of each of the kv head's query heads in turn,
// summing dK and dV; flash_dq takes a tile of query rows and walks the key tiles, summing dQ.
// Both recompute P = exp(scores - lse) and dS = P (dP - D), D_i = dout_i · out_i.
//
// The tiles (shared memory in fp32, key rows padded against bank conflicts, head sizes up to
// limits::kFusedHeadSize) are flash_tiles.cuh's, shared with attention_block.cu.
#include <cmath>

#include "backend/cuda/flash_tiles.cuh"

namespace tessera::cuda {

namespace {

using namespace flash;

// The heads of one batch row of the packed qkv: row length, and where query head h and kv head g
// start in it.
struct Heads {
  int NH, NKV, hs;
  __device__ int row() const { return (NH + 2 * NKV) * hs; }
  __device__ int q(int h) const { return h * hs; }
  __device__ int k(int g) const { return (NH + g) * hs; }
  __device__ int v(int g) const { return (NH + NKV + g) * hs; }
  __device__ int kv_of(int h) const { return h / (NH / NKV); }
};

// Key `key` is visible to query row i of sequence b: at or before it, and under a document mask
// (doc_start (B,T)) at or after its document's start.
__device__ inline bool seen(const int32_t* doc_start, int b, int T, int i, int key) {
  return key <= i && (!doc_start || key >= doc_start[size_t(b) * T + i]);
}

// grid (ceil(T / kBr), B * NH), kThreads threads.
template <typename F, int Dmax>
__global__ void flash_forward_kernel(F* out, float* lse, const F* qkv, int T, Heads heads,
                                     float scale, const int32_t* doc_start) {
  constexpr int R = kRowsPerWarp<Dmax>, kBr = kWarps * R, kDims = Dmax / kWarp;
  TESSERA_SHARED(float, qs, [kBr][Dmax]);
  TESSERA_SHARED(float, ks, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, vs, [kBc][Dmax]);
  TESSERA_SHARED(float, ps, [kBr][kBc]);
  const int hs = heads.hs, C3 = heads.row();
  const int bh = blockIdx.y, b = bh / heads.NH, h = bh % heads.NH, g = heads.kv_of(h);
  const int q0 = blockIdx.x * kBr;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const F* base = qkv + size_t(b) * T * C3;
  load_tile<F, kBr, Dmax>(qs, base + heads.q(h), q0, T, hs, C3);

  float m[R], l[R], o[R][kDims];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < kDims; k++) o[r][k] = 0.0f;
  }
  const int last = (T < q0 + kBr ? T : q0 + kBr) - 1;  // the block's last query row
  for (int k0 = 0; k0 <= last; k0 += kBc) {
    __syncthreads();  // the previous tile's readers are done (and, first, qs is complete)
    load_tile<F, kBc, Dmax + 1>(ks, base + heads.k(g), k0, T, hs, C3);
    load_tile<F, kBc, Dmax>(vs, base + heads.v(g), k0, T, hs, C3);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T) break;  // the same for every lane of the warp
      online_softmax_tile<Dmax>(m[r], l[r], o[r], ps[row], qs[row], ks, vs,
                                seen(doc_start, b, T, i, k0 + lane), scale, hs);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    if (i >= T) break;
    F* y = out + (size_t(b) * T + i) * heads.NH * hs + size_t(h) * hs;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int k = 0; k < kDims; k++) {
      const int d = lane + k * kWarp;
      if (d < hs) y[d] = from_float<F>(o[r][k] * inv);
    }
    if (lane == 0) lse[size_t(bh) * T + i] = m[r] + logf(l[r]);
  }
}

// D[r] = dout_row · out_row for the rows of a tile, by warp (rows warp, warp + kWarps, ...).
template <typename F, int Rows>
__device__ void row_dots(float* D, const F* dout, const F* out, int row0, int T, int hs,
                         size_t ld) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int r = warp; r < Rows; r += kWarps) {
    const int row = row0 + r;
    float s = 0.0f;
    if (row < T)
      for (int d = lane; d < hs; d += kWarp)
        s += to_float(dout[size_t(row) * ld + d]) * to_float(out[size_t(row) * ld + d]);
    s = warp_sum(s);
    if (lane == 0) D[r] = s;
  }
}

// grid (ceil(T / kBc), B * NKV), kThreads threads: dK and dV of one tile of 32 keys of one kv
// head, summed over its query heads in order. Warp w owns keys 8w .. 8w + 7 of the tile, lane its
// dimensions.
template <typename F, int Dmax>
__global__ void flash_dkdv_kernel(F* dqkv, const F* dout, const F* qkv, const F* out,
                                  const float* lse, int T, Heads heads, float scale,
                                  const int32_t* doc_start) {
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
  const int hs = heads.hs, C3 = heads.row(), Cq = heads.NH * hs, G = heads.NH / heads.NKV;
  const int bg = blockIdx.y, b = bg / heads.NKV, g = bg % heads.NKV;
  const int k0 = blockIdx.x * kBc;
  const F* base = qkv + size_t(b) * T * C3;
  load_tile<F, kBc, Dmax + 1>(ks, base + heads.k(g), k0, T, hs, C3);
  load_tile<F, kBc, Dmax + 1>(vs, base + heads.v(g), k0, T, hs, C3);

  float dk[kKeysPerWarp][kDims], dv[kKeysPerWarp][kDims];
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; j++)
#pragma unroll
    for (int k = 0; k < kDims; k++) dk[j][k] = dv[j][k] = 0.0f;

  for (int h = g * G; h < (g + 1) * G; h++) {
    const size_t obase = size_t(b) * T * Cq + size_t(h) * hs;
    const float* row_lse = lse + (size_t(b) * heads.NH + h) * T;
    // Query rows below k0 see none of these keys.
    for (int i0 = k0 / kBq * kBq; i0 < T; i0 += kBq) {
      __syncthreads();  // the previous rows' readers are done (and, first, ks and vs are complete)
      load_tile<F, kBq, Dmax>(qs, base + heads.q(h), i0, T, hs, C3);
      load_tile<F, kBq, Dmax>(dos, dout + obase, i0, T, hs, Cq);
      row_dots<F, kBq>(Ds, dout + obase, out + obase, i0, T, hs, Cq);
      for (int r = threadIdx.x; r < kBq; r += kThreads)
        lses[r] = i0 + r < T ? row_lse[i0 + r] : 0.0f;
      __syncthreads();
      score_gradients_block<kBq, Dmax>(ps, dss, qs, dos, ks, vs, lses, Ds, i0, k0, T, scale, hs,
                                       [&](int i, int key) {
                                         return seen(doc_start, b, T, i, key);
                                       });
      __syncthreads();
      accumulate_dkdv<kBq, Dmax, kKeysPerWarp>(dk, dv, ps, dss, qs, dos);
    }
  }
  F* rows = dqkv + size_t(b) * T * C3;
  add_key_gradients<F, Dmax, kKeysPerWarp>(rows + heads.k(g), rows + heads.v(g), C3, k0, T, hs,
                                           scale, dk, dv);
}

// grid (ceil(T / kBr), B * NH), kThreads threads: dQ of one tile of query rows.
template <typename F, int Dmax>
__global__ void flash_dq_kernel(F* dqkv, const F* dout, const F* qkv, const F* out,
                                const float* lse, int T, Heads heads, float scale,
                                const int32_t* doc_start) {
  constexpr int R = kRowsPerWarp<Dmax>, kBr = kWarps * R, kDims = Dmax / kWarp;
  TESSERA_SHARED(float, qs, [kBr][Dmax]);
  TESSERA_SHARED(float, dos, [kBr][Dmax]);
  TESSERA_SHARED(float, ks, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, vs, [kBc][Dmax + 1]);
  TESSERA_SHARED(float, dss, [kBr][kBc]);
  TESSERA_SHARED(float, Ds, [kBr]);
  const int hs = heads.hs, C3 = heads.row(), Cq = heads.NH * hs;
  const int bh = blockIdx.y, b = bh / heads.NH, h = bh % heads.NH, g = heads.kv_of(h);
  const int q0 = blockIdx.x * kBr;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const F* base = qkv + size_t(b) * T * C3;
  const size_t obase = size_t(b) * T * Cq + size_t(h) * hs;
  load_tile<F, kBr, Dmax>(qs, base + heads.q(h), q0, T, hs, C3);
  load_tile<F, kBr, Dmax>(dos, dout + obase, q0, T, hs, Cq);
  row_dots<F, kBr>(Ds, dout + obase, out + obase, q0, T, hs, Cq);

  float lse_r[R], dq[R][kDims];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    lse_r[r] = i < T ? lse[size_t(bh) * T + i] : 0.0f;
#pragma unroll
    for (int k = 0; k < kDims; k++) dq[r][k] = 0.0f;
  }
  const int last = (T < q0 + kBr ? T : q0 + kBr) - 1;
  for (int k0 = 0; k0 <= last; k0 += kBc) {
    __syncthreads();
    load_tile<F, kBc, Dmax + 1>(ks, base + heads.k(g), k0, T, hs, C3);
    load_tile<F, kBc, Dmax + 1>(vs, base + heads.v(g), k0, T, hs, C3);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T) break;  // the same for every lane of the warp
      float p, ds = 0.0f;
      if (seen(doc_start, b, T, i, k0 + lane))
        ds = score_gradient<Dmax>(qs[row], dos[row], ks, vs, lse_r[r], Ds[row], scale, hs, &p);
      accumulate_dq<Dmax>(dq[r], dss[row], ds, ks);
    }
  }
  add_query_gradients<F, Dmax, R>(dqkv + size_t(b) * T * C3 + heads.q(h), C3, q0, T, hs, scale,
                                  dq);
}

}  // namespace

template <typename F>
void attention_fused_forward(F* out, float* lse, const F* qkv, int B, int T, int NH, int NKV,
                             int hs, const int32_t* doc_start) {
  if (B <= 0 || T <= 0) return;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const Heads heads{NH, NKV, hs};
  with_head_tile(hs, [&]<int Dmax>() {
    const dim3 grid(row_tiles<Dmax>(T), unsigned(B * NH));
    launch<flash_forward_kernel<F, Dmax>>(grid, kThreads, 0, stream(), out, lse, qkv, T, heads,
                                          scale, doc_start);
  });
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void attention_fused_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const float* lse,
                              int B, int T, int NH, int NKV, int hs, const int32_t* doc_start) {
  if (B <= 0 || T <= 0) return;
  const float scale = float(1.0 / std::sqrt(double(hs)));
  const Heads heads{NH, NKV, hs};
  with_head_tile(hs, [&]<int Dmax>() {
    const dim3 key_grid(blocks_for(size_t(T), kBc), unsigned(B * NKV));
    launch<flash_dkdv_kernel<F, Dmax>>(key_grid, kThreads, 0, stream(), dqkv, dout, qkv, out, lse,
                                       T, heads, scale, doc_start);
    CUDA_CHECK_LAUNCH();
    const dim3 row_grid(row_tiles<Dmax>(T), unsigned(B * NH));
    launch<flash_dq_kernel<F, Dmax>>(row_grid, kThreads, 0, stream(), dqkv, dout, qkv, out, lse, T,
                                     heads, scale, doc_start);
  });
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_fused_forward<F>(F*, float*, const F*, int, int, int, int, int,         \
                                           const int32_t*);                                        \
  template void attention_fused_backward<F>(F*, const F*, const F*, const F*, const float*, int,   \
                                            int, int, int, int, const int32_t*);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
