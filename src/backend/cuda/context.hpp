#pragma once
// The backend's state on one rank: the stream every op runs on, the cuBLAS handle bound to it and
// its workspace, a small device scratch for reductions, and the copy stream that brings each
// step's tokens over while the compute stream works. Created once at start (after cudaSetDevice),
// so no op allocates.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessera::cuda {

// `stream` = nullptr creates a non-blocking stream of its own. Logs nothing; `bytes_allocated()`
// is what init took from the device (for the start-up memory log).
void init(cudaStream_t stream = nullptr);
void shutdown();
bool initialized();
cudaStream_t stream();
size_t bytes_allocated();

}  // namespace tessera::cuda
