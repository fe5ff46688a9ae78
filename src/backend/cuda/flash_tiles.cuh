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
