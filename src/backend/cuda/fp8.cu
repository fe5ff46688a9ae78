// FP8 GEMM inputs on the GPU; twin of backend/cpu/fp8.cpp. The rounding is CUDA's own
// (cuda_fp8.h: __nv_cvt_float_to_fp8 with saturation to the largest finite value, round to nearest
// even; a hardware instruction on sm_89 and later), so the op tests compare it with tessera's
// independent codec (common/fp8.hpp) through the CPU op.
#include <cuda_fp8.h>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 512;

// Pass 1 of the amax: each block's largest |x| and its count of NaNs, into partial[2b], [2b+1].
template <typename F>
__global__ void amax_partial_kernel(double* partial, const F* x, size_t n) {
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  float m = 0.0f;
  double nan = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float a = fabsf(to_float(x[i]));
    if (a != a) nan += 1.0;
    else m = fmaxf(m, a);
  }
  m = block_max(m, shared_max);
  nan = block_sum(nan, shared_nan);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = m;
    partial[2 * blockIdx.x + 1] = nan;
  }
}

// Pass 2: one block folds the partials into partial[0] (max) and partial[1] (NaNs).
__global__ void amax_finish_kernel(double* partial, int count) {
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  float m = 0.0f;
  double nan = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    m = fmaxf(m, float(partial[2 * i]));
    nan += partial[2 * i + 1];
  }
  m = block_max(m, shared_max);
  nan = block_sum(nan, shared_nan);
  __syncthreads();  // every thread has read its partials before thread 0 overwrites the first
  if (threadIdx.x == 0) {
    partial[0] = m;
    partial[1] = nan;
  }
}

template <typename F, __nv_fp8_interpretation_t kFormat>
__global__ void quantize_kernel(F* out, const F* in, size_t n, float scale, float inv) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(to_float(in[i]) * scale, __NV_SATFINITE,
                                                        kFormat);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, kFormat);  // exact: FP8 fits in fp16
  out[i] = from_float<F>(__half2float(__half(h)) * inv);
}

}  // namespace

template <typename F>
float fp8_amax(const F* x, size_t n) {
  if (n == 0) return 0.0f;
  const size_t want = (n + kReduceThreads - 1) / kReduceThreads;
  const int grid = int(want < size_t(kScratchDoubles / 2) ? want : size_t(kScratchDoubles / 2));
  double* partial = scratch();
  launch<amax_partial_kernel<F>>(grid, kReduceThreads, 0, stream(), partial, x, n);
  CUDA_CHECK_LAUNCH();
  launch<amax_finish_kernel>(1, kReduceThreads, 0, stream(), partial, grid);
  CUDA_CHECK_LAUNCH();
  double result[2];
  to_host(result, partial, sizeof result);
  return result[1] > 0 ? NAN : float(result[0]);
}

template <typename F>
void fp8_quantize(F* out, const F* in, size_t n, float scale, Fp8Format format) {
  if (n == 0) return;
  const float inv = 1.0f / scale;  // as the CPU's: the dequantizing factor
  const unsigned grid = blocks_for(n, kThreads);
  if (format == Fp8Format::E4M3)
    launch<quantize_kernel<F, __NV_E4M3>>(grid, kThreads, 0, stream(), out, in, n, scale, inv);
  else
    launch<quantize_kernel<F, __NV_E5M2>>(grid, kThreads, 0, stream(), out, in, n, scale, inv);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template float fp8_amax<F>(const F*, size_t);                                                  \
  template void fp8_quantize<F>(F*, const F*, size_t, float, Fp8Format);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
