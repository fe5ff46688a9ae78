// The CUDA emulator itself (src/device/emu; emulated builds only): that its barriers and warp
// collectives mean what CUDA's mean, that the two orders tell a race apart, and that a kernel or
// call a GPU would fault on, hang on or refuse ends with one line here too.
#ifdef TESSERA_CUDA_EMU
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/common.cuh"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

using cuda::launch;

// Every thread of a 1024-thread block gets the block's sum (common.cuh's block_sum: warp
// shuffles, shared memory, two barriers) and its warp's sum by __shfl_down_sync.
__global__ void sums_kernel(float* block_out, float* warp_out, const float* in) {
  __shared__ float shared[32];
  const float x = in[threadIdx.x];
  block_out[threadIdx.x] = cuda::block_sum(x, shared);
  float w = x;
  for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
  warp_out[threadIdx.x] = __shfl_sync(0xffffffffu, w, 0);  // lane 0 holds the warp's sum
}

// out[i] = in[i + 1] of the block's elements (the last one wraps), through shared memory; with
// `sync` false the barrier between the write and the read is missing.
template <bool sync>
__global__ void rotate_kernel(float* out, const float* in) {
  __shared__ float shared[256];
  shared[threadIdx.x] = in[threadIdx.x];
  if (sync) __syncthreads();
  out[threadIdx.x] = shared[(threadIdx.x + 1) % blockDim.x];
}

std::vector<float> rotate(bool sync, const std::vector<float>& in) {
  Dev<float> d_in(std::vector<double>(in.begin(), in.end())), d_out(in.size());
  if (sync) launch<rotate_kernel<true>>(1, unsigned(in.size()), 0, nullptr, d_out.get(), d_in.get());
  else launch<rotate_kernel<false>>(1, unsigned(in.size()), 0, nullptr, d_out.get(), d_in.get());
  const std::vector<double> out = d_out.fetch();
  return std::vector<float>(out.begin(), out.end());
}

TEST(Emulator, BlockAndWarpSums) {
  std::vector<double> in(1024);
  for (size_t i = 0; i < in.size(); i++) in[i] = double(i % 7);
  Dev<float> d_in(in), d_block(1024), d_warp(1024);
  launch<sums_kernel>(1, 1024, 0, device::stream(), d_block.get(), d_warp.get(), d_in.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  double total = 0;
  for (double x : in) total += x;
  const std::vector<double> block = d_block.fetch(), warp = d_warp.fetch();
  for (size_t t = 0; t < 1024; t++) {
    ASSERT_EQ(block[t], total) << "thread " << t;
    double w = 0;
    for (size_t k = t / 32 * 32; k < t / 32 * 32 + 32; k++) w += in[k];
    ASSERT_EQ(warp[t], w) << "thread " << t;
  }
}

// A missing __syncthreads reads values not written yet: forward order shows it at once (each
// thread runs to its end before the next starts), while the kernel with its barrier is right in
// every order. Each launch has new data, so what a previous launch left in shared memory does
// not pass for the answer.
TEST(Emulator, MissingBarrierIsCaught) {
  std::vector<float> in(256);
  for (int launch_no = 0; launch_no < 3; launch_no++) {
    for (size_t i = 0; i < in.size(); i++) in[i] = float(i * 3 + size_t(launch_no) * 1000);
    std::vector<float> want(in.size());
    for (size_t i = 0; i < in.size(); i++) want[i] = in[(i + 1) % in.size()];
    EXPECT_EQ(rotate(true, in), want);
    EXPECT_NE(rotate(false, in), want) << "launch " << launch_no;
  }
}

__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1);
}
TEST(EmulatorDeathTest, ShuffleNamingAnExitedLane) {
  Dev<float> out(32);
  EXPECT_DEATH(launch<exited_lane_kernel>(1, 32, 0, nullptr, out.get()),
               "exited_lane_kernel.*names lane 5, which has exited");
}

__global__ void divergent_barrier_kernel(float* out) {
  float x = float(threadIdx.x);
  if (threadIdx.x < 16) __syncthreads();
  else x = __shfl_xor_sync(0xffffffffu, x, 1);
  out[threadIdx.x] = x;
}
TEST(EmulatorDeathTest, BarrierAndShuffleThatNeverMeet) {
  Dev<float> out(64);
  EXPECT_DEATH(launch<divergent_barrier_kernel>(1, 64, 0, nullptr, out.get()),
               "the block can never finish: thread \\(0,0,0\\) waits in __syncthreads");
}

__global__ void mask_without_caller_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, float(threadIdx.x), 1);
}
TEST(EmulatorDeathTest, MaskLeavingOutTheCaller) {
  Dev<float> out(32);
  EXPECT_DEATH(launch<mask_without_caller_kernel>(1, 32, 0, nullptr, out.get()),
               "mask 0x0000ffff\\) called by lane [0-9]+, which the mask leaves out");
}

__global__ void write_kernel(float* out) { out[threadIdx.x] = 1.0f; }
TEST(EmulatorDeathTest, HostPointerToAKernel) {
  std::vector<float> host(32);
  EXPECT_DEATH(launch<write_kernel>(1, 32, 0, nullptr, host.data()),
               "write_kernel: argument 0 is a host pointer");
}

TEST(Emulator, InvalidLaunchConfiguration) {
  Dev<float> out(32);
  launch<write_kernel>(1, 2048, 0, nullptr, out.get());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared, as the runtime's
}

TEST(Emulator, CopiesStayInsideTheirAllocations) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 10 * sizeof(float)), cudaSuccess);
  std::vector<float> host(11);
  const cudaStream_t s = device::stream();
  EXPECT_EQ(cudaMemcpyAsync(host.data(), d, 11 * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(d, host.data(), 10 * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaErrorInvalidValue);  // the kind says the source is device memory: it is not
  EXPECT_EQ(cudaMemsetAsync(d + 5, 0, 6 * sizeof(float), s), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(host.data(), d, 10 * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  // cudaMalloc'd memory starts as NaN: an element nobody wrote shows.
  EXPECT_TRUE(std::isnan(host[0]));
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // twice
}

// cuBLAS's own argument checks, e.g. a leading dimension of 0 (a GEMM with K = 0 whose operand
// has no columns), which cuBLAS refuses although nothing would be read.
TEST(Emulator, GemmArgumentsCheckedAsCublas) {
  Dev<float> a(16), b(16), c(16);
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(cublasGemmEx(cuda::blas(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 0, &one, a.get(),
                         CUDA_R_32F, 4, b.get(), CUDA_R_32F, 0, &zero, c.get(), CUDA_R_32F, 4,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  // 4x4 with lda 4 from a buffer of 16 floats fits; from 8 past its start it does not.
  EXPECT_EQ(cublasGemmEx(cuda::blas(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a.get() + 8,
                         CUDA_R_32F, 4, b.get(), CUDA_R_32F, 4, &zero, c.get(), CUDA_R_32F, 4,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_EXECUTION_FAILED);
}

}  // namespace
}  // namespace tessera::gpu_test
#endif
