#pragma once
// The CUDA emulator's memory (runtime.cpp): every cudaMalloc and cudaHostAlloc is recorded, so
// copies, kernels, GEMMs and collectives can check that a pointer is the kind of memory the call
// needs and that the bytes it touches lie inside one allocation.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace tessera::emu {

enum class Space { none, device, pinned };

// The space of [p, p + bytes): device or pinned when one allocation holds all of it, else none
// (host memory the emulator did not allocate, or a range that runs past its allocation).
Space space_of(const void* p, size_t bytes);
// The bytes of the allocation starting at p (0: none starts there).
size_t allocation_bytes(const void* p);
// "" when [p, p + bytes) lies in device memory, else why not (for messages).
std::string check_device_range(const void* p, size_t bytes);

// Whether this process's streams never finish (TESSERA_EMU_NCCL_HANG, nccl.cpp).
bool collective_hung();

// The runtime's sticky last error (cudaGetLastError returns and clears it).
void set_last_error(cudaError_t e);
bool valid_stream(cudaStream_t s);

// One line on stderr, "cuda emulator: what": a diagnosis beside the error code a call returns.
void say(const std::string& what);
// say(what), then abort: a fault a GPU would report as an illegal address or a hang.
[[noreturn]] void fault(const std::string& what);

}  // namespace tessera::emu
