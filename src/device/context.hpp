#pragma once
// This rank's GPU state: the stream every op runs on, the cuBLAS handle bound to it and its
// workspace, the device scratch of the kernels' reductions, and the copy stream that brings each
// step's tokens over while the compute stream works. Created once at start (after cudaSetDevice,
// device::activate), so no op and no communicator allocates; the CUDA backend's kernels
// (backend/cuda) and the NCCL communicators (parallel/nccl_comm) run on it.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessera::device {

// Doubles of device scratch for two-pass reductions (one partial per block).
inline constexpr int kScratchDoubles = 1024;
// Floats of device scratch for pass 1 of the column sums (backend/cuda/common.cuh): 4 MB.
inline constexpr size_t kColumnScratchFloats = size_t(1) << 20;
// Device pointers of one grouped GEMM's operand arrays (backend/cuda/gemm.cu): 3 x 128 problems.
inline constexpr int kGroupedProblems = 128;
inline constexpr size_t kPointerScratch = 3 * size_t(kGroupedProblems);

// `stream` = nullptr creates a non-blocking stream of its own. Logs nothing; `bytes_allocated()`
// is what init took from the device (for the start-up memory log).
void init(cudaStream_t stream = nullptr);
void shutdown();
bool initialized();
cudaStream_t stream();
size_t bytes_allocated();
// The cuBLAS handle bound to stream(), with its workspace set.
cublasHandle_t blas();
// The cuBLASLt handle (the FP8 GEMMs), created on first use; its matmuls run on stream() and
// share cuBLAS's workspace (one stream: never both at once).
cublasLtHandle_t blas_lt();
void* blas_workspace();
size_t blas_workspace_bytes();
double* scratch();         // kScratchDoubles
float* column_scratch();   // kColumnScratchFloats
void** pointer_scratch();  // kPointerScratch
// device.expert_gemm: the routed experts' GEMMs one cublasGemmGroupedBatchedEx per product (true)
// or one cuBLAS call per expert (false, the default); set by device::activate.
void set_grouped_experts(bool on);
bool grouped_experts();
// The copy stream of the step's token uploads, the event the compute stream waits on, and the
// event the copy stream waits on before it overwrites tokens the compute stream may still read.
cudaStream_t copy_stream();
cudaEvent_t uploaded();
cudaEvent_t consumed();

}  // namespace tessera::device
