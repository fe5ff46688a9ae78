#pragma once
// What the emulator's cuBLAS (cublas.cpp) and cuBLASLt (cublas_lt.cpp) share: an element of an
// fp32 or bf16 operand read and written as float, and the bytes a column-major operand spans.
#include <cuda_bf16.h>
#include <library_types.h>

#include <cstddef>

namespace tessera::emu {

// C and D of both libraries are fp32 or bf16; bf16 is stored rounded to nearest even.
inline float load(const void* p, cudaDataType t, long long i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
inline void store(void* p, cudaDataType t, long long i, float x) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = x;
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}

// The types the two libraries are asked for: fp32, bf16, and cuBLASLt's FP8 operands.
inline size_t element_bytes(cudaDataType t) {
  if (t == CUDA_R_32F) return 4;
  if (t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2) return 1;
  return 2;
}

// The bytes a column-major operand of rows x cols with leading dimension ld touches, batch
// entries `stride` apart.
inline size_t extent(long long rows, long long cols, long long ld, long long stride, int batch,
                     cudaDataType t) {
  if (rows == 0 || cols == 0) return 0;
  const long long last = (cols - 1) * ld + rows + (long long)(batch - 1) * stride;
  return size_t(last) * element_bytes(t);
}

}  // namespace tessera::emu
