#pragma once
// What the kernels share: bf16 <-> fp32, 16-byte packs, warp and block reductions, launch sizes,
// and launch() itself. Included by the .cu files only (under nvcc, or g++ in the emulated build).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.hpp"
#include "device/check.hpp"
#include "device/context.hpp"

namespace tessera::cuda {

// The rank's stream, cuBLAS handle and reduction scratch (device/context.hpp), by the names the
// kernels' launches use.
using device::blas;
using device::column_scratch;
using device::kScratchDoubles;
using device::scratch;
using device::stream;

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <typename F>
__device__ __forceinline__ F from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// W consecutive elements moved as one access: W = 16 / sizeof(F) gives 16-byte loads and stores
// (ld.global.v4), W = 1 the scalar fallback for pointers that are not 16-byte aligned.
template <typename F, int W>
struct alignas(sizeof(F) * W) Pack {
  F v[W];
};
template <typename F, int W>
__device__ __forceinline__ Pack<F, W> load_pack(const F* p) {
  return *reinterpret_cast<const Pack<F, W>*>(p);
}
template <typename F, int W>
__device__ __forceinline__ void store_pack(F* p, const Pack<F, W>& x) {
  *reinterpret_cast<Pack<F, W>*>(p) = x;
}
template <typename F>
inline constexpr int kPack = 16 / int(sizeof(F));

template <typename F>
constexpr cudaDataType_t data_type() {
  return sizeof(F) == 4 ? CUDA_R_32F : CUDA_R_16BF;
}

// The row-major GEMM behind gemm<F> with each operand's type given (A and B alike, C fp32 or the
// same): C (M,N) = alpha op(A) op(B) + beta C, fp32 accumulation. Defined in gemm.cu.
void gemm_ex(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
             const void* B, int ldb, cudaDataType_t ab_type, float beta, void* C, int ldc,
             cudaDataType_t c_type);
// `batch` such products, operand i at A + i*stride_a elements (likewise B, C).
void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const void* A, int lda, long long stride_a, const void* B, int ldb,
                          long long stride_b, cudaDataType_t ab_type, float beta, void* C,
                          int ldc, long long stride_c, cudaDataType_t c_type, int batch);

// Products of gemm_ex's meaning, one cublasGemmGroupedBatchedEx per 128 of them (each its own
// group): product i is C_i (M_i,N) = alpha op(A_i) op(B_i) + beta_i C_i over K_i, the transposes,
// N, leading dimensions and types the same for all. A product with M_i = 0 is skipped, one with
// K_i = 0 is C_i = beta_i C_i. Defined in gemm.cu.
struct GroupedProduct {
  int M, K;
  const void* A;
  const void* B;
  void* C;
  float beta;
};
void gemm_grouped(bool trans_a, bool trans_b, int N, float alpha, const GroupedProduct* products,
                  int count, int lda, int ldb, cudaDataType_t ab_type, int ldc,
                  cudaDataType_t c_type);

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Sum (or max) over the block; every thread gets the result. blockDim.x a multiple of 32,
// at most 1024. `shared` holds 32 values; the leading barrier lets a caller reuse it.
template <typename T>
__device__ T block_sum(T x, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : T(0);
  return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(x);
}

// Blocks of `threads` covering `work` items (at least one block, so tails of < W elements run).
inline unsigned blocks_for(size_t work, int threads) {
  const size_t b = (work + size_t(threads) - 1) / size_t(threads);
  return unsigned(b > 0 ? b : 1);
}

// Column sums over many rows (the bias and LayerNorm weight gradients), in two passes so that
// enough blocks run to fill the GPU and every addition has a fixed place (no atomics, the same
// bits each run and on every GPU): pass 1 is a grid of (32-column tiles) x (row chunks) blocks of
// 32x32 threads, each writing its chunk's sums of its 32 columns to partial[chunk * cols + col]
// (column_scratch()); pass 2 (add_column_partials) adds each column's chunks in order onto the
// output. The split depends on the shape alone.
struct ColumnSplit {
  int chunks, rows_per_chunk;
};
// `outputs` column sums of `cols` columns each share the scratch.
ColumnSplit column_split(int rows, int cols, int outputs);
// out (cols) += Σ_chunk partial[chunk * cols + col], chunks in order.
void add_column_partials(float* out, const float* partial, int chunks, int cols);

}  // namespace tessera::cuda
