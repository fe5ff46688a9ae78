// The backend's per-rank state (context.hpp). One host thread per rank drives the device, so a
// plain struct is enough.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

// cuBLAS's own recommendation for Hopper is 32 MiB of workspace (4 MiB suffices before it); given
// once here, so cuBLAS never allocates behind our back during a step.
constexpr size_t kBlasWorkspace = size_t(32) << 20;

struct Context {
  bool ready = false;
  bool own_stream = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  double* scratch = nullptr;
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
  CUDA_CHECK(cudaMalloc(&g.workspace, kBlasWorkspace));
  CUDA_CHECK(cudaMalloc(&g.scratch, kScratchDoubles * sizeof(double)));
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
  cudaFree(g.scratch);
  cudaFree(g.workspace);
  if (g.own_stream) cudaStreamDestroy(g.stream);
  g = Context{};
}

bool initialized() { return g.ready; }
cudaStream_t stream() { return g.stream; }
size_t bytes_allocated() { return g.ready ? kBlasWorkspace + kScratchDoubles * sizeof(double) : 0; }
cublasHandle_t blas() { return g.blas; }
double* scratch() { return g.scratch; }

}  // namespace tessera::cuda
