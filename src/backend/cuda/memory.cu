// The CUDA backend's memory functions (ops.hpp), twin of backend/cpu/memory.cpp: the arena's
// device allocation, the loader's pinned ring, copies queued on the rank's stream
// (device/context.hpp), and the start-up log's memory report and peak.
#include <cstdio>
#include <string>

#include "backend/cuda/common.cuh"
#include "common/gpu_datasheet.hpp"
#include "device/stream_wait.hpp"
#ifdef TESSERA_CUDA_EMU
#include "device/emu/races.hpp"
#endif

namespace tessera::cuda {

namespace {

// The arena's one allocation: every buffer of the run. Out of memory says how much was asked
// and how much the GPU has left, as cudaMemGetInfo sees it.
void* device_allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    char call[128], reason[128];
    std::snprintf(call, sizeof call, "cudaMalloc of %.1f MB (every buffer of the run)",
                  bytes / 1e6);
    std::snprintf(reason, sizeof reason, "out of memory: %.1f MB free of %.1f MB", free / 1e6,
                  total / 1e6);
    device::fail(call, reason, __FILE__, __LINE__);
  }
  CUDA_CHECK(e);
  return p;
}
void device_release(void* p) { cudaFree(p); }  // no check: runs in a destructor
// Page-locked: pageable memory would make cudaMemcpyAsync stage through a driver buffer and block
// the host; pinned memory is copied by the DMA engine directly.
void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void pinned_release(void* p) { cudaFreeHost(p); }

}  // namespace

#ifdef TESSERA_CUDA_EMU
Allocator memory() { return {device_allocate, device_release, emu::name_region}; }
Allocator loader_memory() { return {pinned_allocate, pinned_release, emu::name_region}; }
#else
Allocator memory() { return {device_allocate, device_release}; }
Allocator loader_memory() { return {pinned_allocate, pinned_release}; }
#endif

void zero(void* p, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()));  // 0 bits are +0 in fp32 and bf16
}

void copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void to_host(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  device::wait_stream(stream(), "a copy to the host");
}

void to_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  device::wait_stream(stream(), "a copy to the device");  // the host may reuse src on return
}

void upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // The copy overwrites tokens that kernels queued on the compute stream may still read (the
  // previous step's, an evaluation's): the copy stream waits for the compute stream first.
  CUDA_CHECK(cudaEventRecord(device::consumed(), stream()));
  CUDA_CHECK(cudaStreamWaitEvent(device::copy_stream(), device::consumed(), 0));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, device::copy_stream()));
  CUDA_CHECK(cudaEventRecord(device::uploaded(), device::copy_stream()));
}

void await_uploads() { CUDA_CHECK(cudaStreamWaitEvent(stream(), device::uploaded(), 0)); }

void sync() { device::wait_stream(stream(), "the step's work"); }

void poison(void* p, size_t bytes) {
#ifdef TESSERA_CUDA_EMU
  CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, stream()));
#else
  (void)p, (void)bytes;
#endif
}

std::string memory_report(const Arena& arena, bool bf16) {
  char backend[96];
  std::snprintf(backend, sizeof backend, "\n  cuBLAS workspace and reduction scratch: %.1f MB",
                device::bytes_allocated() / 1e6);
  return std::string("device memory (rank 0, ") + (bf16 ? "bf16" : "fp32") + "):\n" +
         arena.report() + backend;
}

// The datasheet's dense peak (common/gpu_datasheet.hpp, the planner's table too) of this GPU for
// the run's GEMMs: fp8 on the FP8 tensor cores, bf16 on the bf16 ones, fp32 without TF32 (the
// fp32 path's GEMMs) on the CUDA cores.
double peak_gflops(bool bf16, bool fp8) {
  int dev = 0;
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  const bool pcie = std::string(p.name).find("PCIe") != std::string::npos;
  const GpuPeaks peaks = datasheet_peaks(p.major, p.minor, pcie);
  return (fp8 ? peaks.fp8 : bf16 ? peaks.bf16 : peaks.fp32) / 1e9;
}

}  // namespace tessera::cuda
