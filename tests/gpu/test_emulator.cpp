// The CUDA emulator itself (src/device/emu; emulated builds only): that its barriers and warp
// collectives mean what CUDA's mean, that the two orders tell a race apart, and that a kernel or
// call a GPU would fault on, hang on or refuse ends with one line here too.
#ifdef TESSERA_CUDA_EMU
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

using cuda::launch;

// Every thread of a 1024-thread block gets the block's sum (common.cuh's block_sum: warp
// shuffles, shared memory, two barriers) and its warp's sum by __shfl_down_sync.
__global__ void sums_kernel(float* block_out, float* warp_out, const float* in) {
  TESSERA_SHARED(float, shared, [32]);
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
  TESSERA_SHARED(float, shared, [256]);
  shared[threadIdx.x] = in[threadIdx.x];
  if (sync) __syncthreads();
  out[threadIdx.x] = shared[(threadIdx.x + 1) % blockDim.x];
}

std::vector<float> rotate(bool sync, const std::vector<float>& in) {
  Dev<float> d_in(std::vector<double>(in.begin(), in.end())), d_out(in.size());
  if (sync) launch<rotate_kernel<true>>(1, unsigned(in.size()), 0, device::stream(), d_out.get(), d_in.get());
  else launch<rotate_kernel<false>>(1, unsigned(in.size()), 0, device::stream(), d_out.get(), d_in.get());
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

// Block 0 fills its shared row and reads it back; block 1 reads the row without filling it. On a
// GPU that row holds whatever was there; in the emulator it holds NaN (each block's static shared
// memory is poisoned), never block 0's values, in either order of the blocks.
__global__ void unloaded_row_kernel(float* out, const float* in) {
  TESSERA_SHARED(float, row, [64]);
  if (blockIdx.x == 0) row[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = row[(threadIdx.x + 1) % blockDim.x];
}
TEST(Emulator, SharedMemoryARowDidNotLoadIsNaN) {
  std::vector<double> in(64);
  for (size_t i = 0; i < in.size(); i++) in[i] = double(i) + 0.5;
  Dev<float> d_in(in), d_out(128);
  for (int repeat = 0; repeat < 2; repeat++) {
    launch<unloaded_row_kernel>(2, 64, 0, device::stream(), d_out.get(), d_in.get());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<double> out = d_out.fetch();
    for (size_t t = 0; t < 64; t++) {
      ASSERT_EQ(out[t], in[(t + 1) % 64]) << "block 0, thread " << t;
      ASSERT_TRUE(std::isnan(out[64 + t])) << "block 1, thread " << t << " read " << out[64 + t];
    }
  }
}

__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1);
}
TEST(EmulatorDeathTest, ShuffleNamingAnExitedLane) {
  Dev<float> out(32);
  EXPECT_DEATH(
      {
        launch<exited_lane_kernel>(1, 32, 0, device::stream(), out.get());
        sync();  // with asynchronous streams the grid runs here
      },
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
  EXPECT_DEATH(
      {
        launch<divergent_barrier_kernel>(1, 64, 0, device::stream(), out.get());
        sync();  // with asynchronous streams the grid runs here
      },
      "the block can never finish: thread \\(0,0,0\\) waits in __syncthreads");
}

__global__ void mask_without_caller_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, float(threadIdx.x), 1);
}
TEST(EmulatorDeathTest, MaskLeavingOutTheCaller) {
  Dev<float> out(32);
  EXPECT_DEATH(
      {
        launch<mask_without_caller_kernel>(1, 32, 0, device::stream(), out.get());
        sync();  // with asynchronous streams the grid runs here
      },
      "mask 0x0000ffff\\) called by lane [0-9]+, which the mask leaves out");
}

__global__ void write_kernel(float* out) { out[threadIdx.x] = 1.0f; }
TEST(EmulatorDeathTest, HostPointerToAKernel) {
  std::vector<float> host(32);
  EXPECT_DEATH(launch<write_kernel>(1, 32, 0, device::stream(), host.data()),
               "write_kernel: argument 0 is a host pointer");
}

// Asynchronous streams (TESSERA_EMU_STREAMS=async, as make test-cuda-host runs this): work queued
// on two streams runs, when the host waits, in a seeded order that respects event edges only.
// With the edge, the reader always sees what the writer wrote; without it, some of 40 drains run
// the reader first and it reads the NaN poison. In sync mode every launch runs at once: both
// always see the writes, and the missing-edge count is 0.
__global__ void fill_kernel(float* x, float v) { x[threadIdx.x] = v; }
__global__ void copy_kernel(float* out, const float* in) { out[threadIdx.x] = in[threadIdx.x]; }
__global__ void copy_ints_kernel(float* out, const int32_t* in) {
  out[threadIdx.x] = float(in[threadIdx.x]);
}

int reads_before_write(bool edge) {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t written = nullptr;
  ck(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
  ck(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
  ck(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), "event");
  int early = 0;
  for (int trial = 0; trial < 40; trial++) {
    Dev<float> x(32), y(32);  // poisoned: NaN
    launch<fill_kernel>(1, 32, 0, a, x.get(), float(trial));
    ck(cudaEventRecord(written, a), "record");
    if (edge) ck(cudaStreamWaitEvent(b, written, 0), "wait");
    launch<copy_kernel>(1, 32, 0, b, y.get(), static_cast<const float*>(x.get()));
    ck(cudaStreamSynchronize(b), "sync");  // a host wait: both streams run
    const std::vector<double> got = y.fetch();
    if (std::isnan(got[0])) early++;
    else EXPECT_EQ(got[0], double(trial));
  }
  cudaEventDestroy(written);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return early;
}

bool env_is(const char* name, const char* prefix, bool unset) {
  const char* v = std::getenv(name);
  return v ? std::string(v).rfind(prefix, 0) == 0 : unset;
}

// With the race detector on (TESSERA_EMU_RACES, the default) the reader without an edge ends the
// run at its launch, in any stream mode, naming both kernels, both streams and the buffer.
// Without the detector it shows (async) as the poison read in some drains.
TEST(EmulatorStreams, AMissingEventWaitIsSeen) {
  const bool async = env_is("TESSERA_EMU_STREAMS", "async", false);
  EXPECT_EQ(reads_before_write(true), 0);
  if (env_is("TESSERA_EMU_RACES", "on", true)) {
    EXPECT_DEATH(reads_before_write(false),
                 "cuda emulator: race on memory at 0x[0-9a-f]+: copy_kernel on stream \"stream "
                 "[0-9]+\" reads what fill_kernel on stream \"stream [0-9]+\" wrote, with no "
                 "event between them");
    return;
  }
  const int early = reads_before_write(false);
  if (async) EXPECT_GT(early, 0) << "no drain ran the unordered reader first";
  else EXPECT_EQ(early, 0);
}

// The detector follows the order the work was queued in: a copy on another stream that reads
// what a kernel wrote, and a kernel that overwrites what a GEMM on another stream read, each
// without an event, end the run; with the event (or after a host wait) they do not.
TEST(EmulatorStreams, RacesAreFoundWithoutRunningThem) {
  if (!env_is("TESSERA_EMU_RACES", "on", true)) GTEST_SKIP() << "TESSERA_EMU_RACES=off";
  cudaStream_t other = nullptr;
  cudaEvent_t done = nullptr;
  ck(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "stream");
  ck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event");
  Dev<float> x(32), y(32);
  std::vector<float> host(32);
  const cudaStream_t compute = device::stream();
  auto copy_back = [&] {
    ck(cudaMemcpyAsync(y.get(), x.get(), 32 * sizeof(float), cudaMemcpyDeviceToDevice, other),
       "copy");
  };
  launch<fill_kernel>(1, 32, 0, compute, x.get(), 1.0f);
  EXPECT_DEATH(copy_back(), "race on memory at 0x[0-9a-f]+: cudaMemcpyAsync on stream \"stream "
                            "[0-9]+\" reads what fill_kernel on stream \"compute\" wrote");
  ck(cudaEventRecord(done, compute), "record");
  ck(cudaStreamWaitEvent(other, done, 0), "wait");
  copy_back();  // ordered by the event
  const float one = 1.0f, zero = 0.0f;
  cublasSetStream(cuda::blas(), other);
  EXPECT_EQ(cublasGemmEx(cuda::blas(), CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, x.get(),
                         CUDA_R_32F, 4, x.get() + 16, CUDA_R_32F, 4, &zero, y.get(), CUDA_R_32F,
                         4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  cublasSetStream(cuda::blas(), compute);
  EXPECT_DEATH(launch<fill_kernel>(1, 32, 0, compute, x.get(), 2.0f),
               "fill_kernel on stream \"compute\" writes what cublasGemmEx on stream \"stream "
               "[0-9]+\" read");
  ck(cudaStreamSynchronize(other), "sync");  // the host has seen the GEMM done
  launch<fill_kernel>(1, 32, 0, compute, x.get(), 2.0f);
  sync();
  cudaEventDestroy(done);
  cudaStreamDestroy(other);
}

// The race the copy stream had: a step's token upload overwrites the buffer that kernels queued
// on the compute stream may still read. upload() makes the copy stream wait for the compute
// stream's work first, so the reader queued before the upload sees the old tokens in every drain.
TEST(EmulatorStreams, TokenUploadWaitsForTheComputeStreamsReaders) {
  int32_t* pinned = nullptr;
  ck(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 32 * sizeof(int32_t), 0), "cudaHostAlloc");
  for (int trial = 0; trial < 40; trial++) {
    std::vector<int32_t> old_tokens(32, trial);
    DevInts tokens(old_tokens);
    Dev<float> seen(32);
    launch<copy_ints_kernel>(1, 32, 0, device::stream(), seen.get(),
                             static_cast<const int32_t*>(tokens));
    for (int i = 0; i < 32; i++) pinned[i] = 1000 + trial;
    cuda::upload(const_cast<int32_t*>(static_cast<const int32_t*>(tokens)), pinned,
                 32 * sizeof(int32_t));
    cuda::await_uploads();
    ASSERT_EQ(seen.fetch()[0], double(trial)) << "trial " << trial << ": the reader saw the upload";
  }
  cudaFreeHost(pinned);
}

TEST(Emulator, InvalidLaunchConfiguration) {
  Dev<float> out(32);
  launch<write_kernel>(1, 2048, 0, device::stream(), out.get());
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
