#pragma once
// Checked CUDA, cuBLAS and NCCL calls. A failure throws tessera's UserError (exit 1, as an I/O
// failure: the deck is fine, the machine is not) with one line that names the call as written,
// the library's reason, this rank and this device, e.g.
//   rank 3, GPU 1: cudaMalloc(&base_, total) failed: out of memory (src/device/arena.cpp:41)
// Only this rank may meet it, so every_rank is false: the rank prints it and MPI_Abort ends the job.
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace tessera::device {

// Set once by the device selection, read by the messages (-1 = not known yet).
void set_identity(int world_rank, int device);

[[noreturn]] void fail(const char* call, const char* reason, const char* file, int line,
                       int exit_code = 1);
const char* cublas_reason(cublasStatus_t status);

}  // namespace tessera::device

#define CUDA_CHECK(call)                                                                       \
  do {                                                                                         \
    const cudaError_t tessera_err_ = (call);                                                   \
    if (tessera_err_ != cudaSuccess)                                                           \
      ::tessera::device::fail(#call, cudaGetErrorString(tessera_err_), __FILE__, __LINE__);    \
  } while (0)

#define CUBLAS_CHECK(call)                                                                     \
  do {                                                                                         \
    const cublasStatus_t tessera_st_ = (call);                                                 \
    if (tessera_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::tessera::device::fail(#call, ::tessera::device::cublas_reason(tessera_st_), __FILE__,  \
                              __LINE__);                                                       \
  } while (0)

#define NCCL_CHECK(call)                                                                       \
  do {                                                                                         \
    const ncclResult_t tessera_nr_ = (call);                                                   \
    if (tessera_nr_ != ncclSuccess)                                                            \
      ::tessera::device::fail(#call, ncclGetErrorString(tessera_nr_), __FILE__, __LINE__);     \
  } while (0)

// After a kernel launch: a bad launch configuration is reported here, at the launch site;
// faults inside the kernel surface at the next checked synchronising call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
