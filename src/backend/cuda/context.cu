// The backend's per-rank state (context.hpp) and its memory functions (ops.hpp). One host thread
// per rank drives the device, so a plain struct is enough.
#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

// cuBLAS's own recommendation for Hopper is 32 MiB of workspace (4 MiB suffices before it); given
// once here, so cuBLAS never allocates behind our back during a step.
constexpr size_t kBlasWorkspace = size_t(32) << 20;
// Pass 1's partial sums of the column reductions (common.cuh): 4 MB.
constexpr size_t kColumnScratchFloats = size_t(1) << 20;
// Pass 1's grid aims at this many blocks: about two per SM of the largest GPUs, whatever GPU runs,
// so the order of the additions (and the bits) does not depend on the device.
constexpr int kColumnBlocks = 256;

struct Context {
  bool ready = false;
  bool own_stream = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  double* scratch = nullptr;
  float* column_scratch = nullptr;
  // Non-blocking, so the copies do not serialise with the legacy default stream; the compute
  // stream waits on `uploaded`, not the host.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t uploaded = nullptr;
};
Context g;

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

void init(cudaStream_t stream) {
  if (g.ready) return;
  if (stream) {
    g.stream = stream;
  } else {
    CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    g.own_stream = true;
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&g.copy_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&g.uploaded, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(&g.workspace, kBlasWorkspace));
  CUDA_CHECK(cudaMalloc(&g.scratch, kScratchDoubles * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&g.column_scratch, kColumnScratchFloats * sizeof(float)));
  CUBLAS_CHECK(cublasCreate(&g.blas));
  CUBLAS_CHECK(cublasSetStream(g.blas, g.stream));
  CUBLAS_CHECK(cublasSetWorkspace(g.blas, g.workspace, kBlasWorkspace));
  // Host-side alpha/beta; the default math mode keeps fp32 GEMMs off TF32 (parity with the CPU).
  CUBLAS_CHECK(cublasSetPointerMode(g.blas, CUBLAS_POINTER_MODE_HOST));
  CUBLAS_CHECK(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH));
  g.ready = true;
}

void shutdown() {
  if (!g.ready) return;
  // Teardown errors are not worth a second error message: the run is over either way.
  cudaStreamSynchronize(g.stream);
  cublasDestroy(g.blas);
  cudaFree(g.column_scratch);
  cudaFree(g.scratch);
  cudaFree(g.workspace);
  cudaEventDestroy(g.uploaded);
  cudaStreamDestroy(g.copy_stream);
  if (g.own_stream) cudaStreamDestroy(g.stream);
  g = Context{};
}

bool initialized() { return g.ready; }
cudaStream_t stream() { return g.stream; }
size_t bytes_allocated() {
  return g.ready ? kBlasWorkspace + kScratchDoubles * sizeof(double) +
                       kColumnScratchFloats * sizeof(float)
                 : 0;
}
cublasHandle_t blas() { return g.blas; }
double* scratch() { return g.scratch; }
float* column_scratch() { return g.column_scratch; }

ColumnSplit column_split(int rows, int cols, int outputs) {
  const int tiles = (cols + kWarp - 1) / kWarp;
  const int most = std::max(1, (rows + kWarp - 1) / kWarp);  // a chunk has a row per thread row
  int chunks = std::clamp((kColumnBlocks + tiles - 1) / tiles, 1, most);
  chunks = std::max(1, std::min(chunks, int(kColumnScratchFloats / (size_t(outputs) * cols))));
  const int per = (rows + chunks - 1) / chunks;
  return {std::max(1, (rows + per - 1) / std::max(per, 1)), std::max(per, 1)};
}

namespace {
__global__ void add_column_partials_kernel(float* out, const float* partial, int chunks,
                                           int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int c = 0; c < chunks; c++) total += partial[size_t(c) * cols + col];
  out[col] += total;
}
}  // namespace

void add_column_partials(float* out, const float* partial, int chunks, int cols) {
  constexpr int kThreads = 256;
  launch<add_column_partials_kernel>(blocks_for(size_t(cols), kThreads), kThreads, 0, g.stream,
                                     out, partial, chunks, cols);
  CUDA_CHECK_LAUNCH();
}

Allocator memory() { return {device_allocate, device_release}; }
Allocator loader_memory() { return {pinned_allocate, pinned_release}; }

void zero(void* p, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g.stream));  // 0 bits are +0 in fp32 and bf16
}

void copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
}

void to_host(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream));
  CUDA_CHECK(cudaStreamSynchronize(g.stream));
}

void to_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream));
  CUDA_CHECK(cudaStreamSynchronize(g.stream));  // the host may reuse src on return
}

void upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.copy_stream));
  CUDA_CHECK(cudaEventRecord(g.uploaded, g.copy_stream));
}

void await_uploads() { CUDA_CHECK(cudaStreamWaitEvent(g.stream, g.uploaded, 0)); }

void sync() { CUDA_CHECK(cudaStreamSynchronize(g.stream)); }

std::string memory_report(const Arena& arena, bool bf16) {
  char backend[96];
  std::snprintf(backend, sizeof backend, "\n  cuBLAS workspace and reduction scratch: %.1f MB",
                bytes_allocated() / 1e6);
  return std::string("device memory (rank 0, ") + (bf16 ? "bf16" : "fp32") + "):\n" +
         arena.report() + backend;
}

// Dense datasheet peaks (no sparsity), as tests/gpu/bench.cpp: bf16 tensor cores; fp32 without
// TF32 (the fp32 path's GEMMs) the CUDA cores. A100: 312 / 19.5 TFLOP/s; H100 SXM and H200:
// 989 / 67; H100 PCIe: 756 / 51.
double peak_gflops(bool bf16) {
  int dev = 0;
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  const bool pcie = std::string(p.name).find("PCIe") != std::string::npos;
  if (p.major == 9) return pcie ? (bf16 ? 756e3 : 51e3) : (bf16 ? 989e3 : 67e3);
  if (p.major == 8 && p.minor == 0) return bf16 ? 312e3 : 19.5e3;
  return 0.0;
}

}  // namespace tessera::cuda
