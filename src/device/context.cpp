// This rank's GPU state (context.hpp). One host thread per rank drives the device, so a plain
// struct is enough.
#include "device/context.hpp"

#include <cublas_v2.h>

#include "device/check.hpp"
#ifdef TESSERA_CUDA_EMU
#include "device/emu/races.hpp"
#endif

namespace tessera::device {

namespace {

// cuBLAS's own recommendation for Hopper is 32 MiB of workspace (4 MiB suffices before it); given
// once here, so cuBLAS never allocates behind our back during a step.
constexpr size_t kBlasWorkspace = size_t(32) << 20;

struct Context {
  bool ready = false;
  bool own_stream = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t blas_lt = nullptr;
  void* workspace = nullptr;
  double* scratch = nullptr;
  float* column_scratch = nullptr;
  void** pointer_scratch = nullptr;
  bool grouped_experts = false;
  // Non-blocking, so the copies do not serialise with the legacy default stream; the compute
  // stream waits on `uploaded`, not the host.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t uploaded = nullptr, consumed = nullptr;
};
Context g;

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
#ifdef TESSERA_CUDA_EMU
  emu::name_stream(g.stream, "compute");
  emu::name_stream(g.copy_stream, "copy");
#endif
  CUDA_CHECK(cudaEventCreateWithFlags(&g.uploaded, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&g.consumed, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(&g.workspace, kBlasWorkspace));
  CUDA_CHECK(cudaMalloc(&g.scratch, kScratchDoubles * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&g.column_scratch, kColumnScratchFloats * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&g.pointer_scratch, kPointerScratch * sizeof(void*)));
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
  if (g.blas_lt) cublasLtDestroy(g.blas_lt);
  cudaFree(g.pointer_scratch);
  cudaFree(g.column_scratch);
  cudaFree(g.scratch);
  cudaFree(g.workspace);
  cudaEventDestroy(g.uploaded);
  cudaEventDestroy(g.consumed);
  cudaStreamDestroy(g.copy_stream);
  if (g.own_stream) cudaStreamDestroy(g.stream);
  g = Context{};
}

bool initialized() { return g.ready; }
cudaStream_t stream() { return g.stream; }
size_t bytes_allocated() {
  return g.ready ? kBlasWorkspace + kScratchDoubles * sizeof(double) +
                       kColumnScratchFloats * sizeof(float) + kPointerScratch * sizeof(void*)
                 : 0;
}
cublasHandle_t blas() { return g.blas; }
cublasLtHandle_t blas_lt() {
  // Not at init: a run without FP8 never loads cuBLASLt (device/cublas_loader.cpp).
  if (!g.blas_lt) CUBLAS_CHECK(cublasLtCreate(&g.blas_lt));
  return g.blas_lt;
}
void* blas_workspace() { return g.workspace; }
size_t blas_workspace_bytes() { return kBlasWorkspace; }
double* scratch() { return g.scratch; }
float* column_scratch() { return g.column_scratch; }
void** pointer_scratch() { return g.pointer_scratch; }
void set_grouped_experts(bool on) { g.grouped_experts = on; }
bool grouped_experts() { return g.grouped_experts; }
cudaStream_t copy_stream() { return g.copy_stream; }
cudaEvent_t uploaded() { return g.uploaded; }
cudaEvent_t consumed() { return g.consumed; }

}  // namespace tessera::device
