#pragma once
// The tiles shared by the fused attention (attention_fused.cu) and context parallelism's block
// attention (attention_block.cu): blocks of kWarps warps, key tiles of kBc = 32 keys (lane j
// scores key j), rows of q, k, v staged in shared memory as fp32 whatever F is. A lane owns
// dimensions lane, lane + 32, ... of its rows (Dmax / 32 of them), Dmax the head size rounded up
// to 32, 64 or 128 (limits::kFusedHeadSize).
#include "backend/cuda/common.cuh"
#include "common/limits.hpp"

namespace tessera::cuda::flash {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * kWarp;
inline constexpr int kBc = kWarp;  // keys per tile: lane j scores key j

// Query rows per warp: fewer for the widest heads, so the tiles fit 48 KB of static shared memory.
template <int Dmax>
inline constexpr int kRowsPerWarp = Dmax > 64 ? 2 : 4;

// tile[r][d] = x[row0 + r][d] in fp32 for rows < T and d < hs, 0 elsewhere; x rows ld apart.
// Key tiles are Dmax + 1 wide so that lanes reading 32 different keys at the same dimension hit
// 32 different banks; the padding column is never read.
template <typename F, int Rows, int Cols>
__device__ void load_tile(float (*tile)[Cols], const F* x, int row0, int T, int hs, size_t ld) {
  constexpr int kWidth = Cols & ~(kWarp - 1);
  for (int e = threadIdx.x; e < Rows * kWidth; e += kThreads) {
    const int r = e / kWidth, d = e % kWidth, row = row0 + r;
    tile[r][d] = row < T && d < hs ? to_float(x[size_t(row) * ld + d]) : 0.0f;
  }
}

__device__ inline float dot_rows(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; d++) s += a[d] * b[d];
  return s;
}

// The steps both attentions take on a tile of 32 keys, `seen` saying whether lane j's key j is
// visible to the query row (causal on the diagonal; the fused attention's key <= i, a block's
// own rule in attention_block.cu).

// Forward, one query row of a warp: its online softmax (running max m, running sum l, the lane's
// output dimensions o) takes the tile's keys; p_row is the row's kBc probabilities' scratch.
template <int Dmax>
__device__ __forceinline__ void online_softmax_tile(float& m, float& l, float (&o)[Dmax / kWarp],
                                                    float* p_row, const float* q_row,
                                                    const float (*ks)[Dmax + 1],
                                                    const float (*vs)[Dmax], bool seen,
                                                    float scale, int hs) {
  const int lane = threadIdx.x % kWarp;
  const float x = seen ? scale * dot_rows(q_row, ks[lane], hs) : -INFINITY;
  const float m_new = fmaxf(m, warp_max(x));
  // No key seen yet (a document mask hid the tiles so far): nothing to take, and exp(m - m_new)
  // would be exp(-inf + inf). The same on every lane: the warp leaves together.
  if (m_new == -INFINITY) return;
  const float p = seen ? expf(x - m_new) : 0.0f;
  const float rescale = expf(m - m_new);
  l = l * rescale + warp_sum(p);
  m = m_new;
  p_row[lane] = p;
  __syncwarp();
#pragma unroll
  for (int c = 0; c < Dmax / kWarp; c++) {
    const int d = lane + c * kWarp;
    float acc = o[c] * rescale;
    for (int j = 0; j < kBc; j++) acc += p_row[j] * vs[j][d];
    o[c] = acc;
  }
}

// Backward: dS of one query row and this lane's key, P (dP - D) with P = exp(score - lse).
template <int Dmax>
__device__ __forceinline__ float score_gradient(const float* q_row, const float* dout_row,
                                                const float (*ks)[Dmax + 1],
                                                const float (*vs)[Dmax + 1], float lse, float D,
                                                float scale, int hs, float* p) {
  const int lane = threadIdx.x % kWarp;
  *p = expf(scale * dot_rows(q_row, ks[lane], hs) - lse);
  return *p * (dot_rows(dout_row, vs[lane], hs) - D);
}

// dK and dV of a warp's kKeysPerWarp keys (its kDims dimensions each) += the (Rows x kBc) block's
// Pᵀ dO and dSᵀ Q.
template <int Rows, int Dmax, int kKeysPerWarp>
__device__ __forceinline__ void accumulate_dkdv(float (&dk)[kKeysPerWarp][Dmax / kWarp],
                                                float (&dv)[kKeysPerWarp][Dmax / kWarp],
                                                const float (*ps)[kBc], const float (*dss)[kBc],
                                                const float (*qs)[Dmax], const float (*dos)[Dmax]) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; j++) {
    const int key = warp * kKeysPerWarp + j;
#pragma unroll
    for (int c = 0; c < Dmax / kWarp; c++) {
      const int d = lane + c * kWarp;
      float a = dv[j][c], gk = dk[j][c];
      for (int r = 0; r < Rows; r++) {
        a += ps[r][key] * dos[r][d];
        gk += dss[r][key] * qs[r][d];
      }
      dv[j][c] = a;
      dk[j][c] = gk;
    }
  }
}

// dQ of one query row of a warp (the lane's dimensions) += its dS row of the tile (ds_row, this
// lane's entry given) times the tile's keys.
template <int Dmax>
__device__ __forceinline__ void accumulate_dq(float (&dq)[Dmax / kWarp], float* ds_row, float ds,
                                              const float (*ks)[Dmax + 1]) {
  const int lane = threadIdx.x % kWarp;
  ds_row[lane] = ds;
  __syncwarp();
#pragma unroll
  for (int c = 0; c < Dmax / kWarp; c++) {
    const int d = lane + c * kWarp;
    float acc = dq[c];
    for (int j = 0; j < kBc; j++) acc += ds_row[j] * ks[j][d];
    dq[c] = acc;
  }
}

// The dkdv kernels' P and dS of a (Rows x kBc) block of query rows i0.. against keys k0..: lane j
// takes key j, warps take rows in turn; see(i, key) is the kernel's visibility rule.
template <int Rows, int Dmax, typename See>
__device__ __forceinline__ void score_gradients_block(float (*ps)[kBc], float (*dss)[kBc],
                                                      const float (*qs)[Dmax],
                                                      const float (*dos)[Dmax],
                                                      const float (*ks)[Dmax + 1],
                                                      const float (*vs)[Dmax + 1],
                                                      const float* lses, const float* Ds, int i0,
                                                      int k0, int T, float scale, int hs,
                                                      const See& see) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int r = warp; r < Rows; r += kWarps) {
    const int i = i0 + r;
    float p = 0.0f, ds = 0.0f;
    if (i < T && see(i, k0 + lane))
      ds = score_gradient<Dmax>(qs[r], dos[r], ks, vs, lses[r], Ds[r], scale, hs, &p);
    ps[r][lane] = p;
    dss[r][lane] = ds;
  }
}

// The epilogues: a warp's keys' dK (scaled) and dV, and its query rows' dQ (scaled), added into
// the F rows of key / query `n` at k + n ld, v + n ld, q + n ld.
template <typename F, int Dmax, int kKeysPerWarp>
__device__ __forceinline__ void add_key_gradients(F* k, F* v, size_t ld, int k0, int T, int hs,
                                                  float scale,
                                                  const float (&dk)[kKeysPerWarp][Dmax / kWarp],
                                                  const float (&dv)[kKeysPerWarp][Dmax / kWarp]) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; j++) {
    const int key = k0 + warp * kKeysPerWarp + j;
    if (key >= T) break;
    F* dkey = k + size_t(key) * ld;
    F* dval = v + size_t(key) * ld;
#pragma unroll
    for (int c = 0; c < Dmax / kWarp; c++) {
      const int d = lane + c * kWarp;
      if (d < hs) {
        dkey[d] = from_float<F>(to_float(dkey[d]) + scale * dk[j][c]);
        dval[d] = from_float<F>(to_float(dval[d]) + dv[j][c]);
      }
    }
  }
}
template <typename F, int Dmax, int R>
__device__ __forceinline__ void add_query_gradients(F* q, size_t ld, int q0, int T, int hs,
                                                    float scale,
                                                    const float (&dq)[R][Dmax / kWarp]) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    if (i >= T) break;
    F* dqrow = q + size_t(i) * ld;
#pragma unroll
    for (int c = 0; c < Dmax / kWarp; c++) {
      const int d = lane + c * kWarp;
      if (d < hs) dqrow[d] = from_float<F>(to_float(dqrow[d]) + scale * dq[r][c]);
    }
  }
}

// Runs body.template operator()<Dmax>() with Dmax the head size rounded up to 32, 64 or 128.
template <typename Body>
void with_head_tile(int hs, const Body& body) {
  if (hs <= 32) body.template operator()<32>();
  else if (hs <= 64) body.template operator()<64>();
  else body.template operator()<128>();
}
static_assert(limits::kFusedHeadSize == 128, "with_head_tile covers head sizes up to 128");

// Blocks of query rows covering T rows.
template <int Dmax>
unsigned row_tiles(int T) {
  return blocks_for(size_t(T), kWarps * kRowsPerWarp<Dmax>);
}

}  // namespace tessera::cuda::flash
