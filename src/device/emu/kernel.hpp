#pragma once
// The CUDA emulator, kernel side (TESSERA_CUDA_EMU builds only: `make test-cuda-host`). There g++
// compiles src/backend/cuda/*.cu as C++, and this file gives their kernels what nvcc would:
//
//   threadIdx, blockIdx, blockDim, gridDim   the coordinates of the CUDA thread that runs
//   TESSERA_SHARED (backend/cuda/launch.cuh) per-block storage: a static of the host thread,
//                                            which runs one block at a time, poisoned (0xFF)
//                                            for each block by poison_shared below
//   __syncthreads()                          the block barrier
//   __shfl_xor_sync, __shfl_down_sync,       warp collectives over 32 lanes: each releases when
//   __shfl_sync, __syncwarp                  every lane its mask names has arrived
//
// launch() (backend/cuda/launch.cuh) hands a grid to run_grid (scheduler.cpp), which queues it on
// its stream (device/emu/streams.hpp); it runs on the host thread that runs the stream's work:
// block after block, each CUDA thread a fiber of its own
// (ucontext) that runs until it reaches a barrier, a warp collective or its end. Blocks and
// threads run in the order TESSERA_EMU_ORDER says: `forward` (the default) or `random[:SEED]`, a
// seeded shuffle drawn anew for every block and every phase between barriers, so a kernel that
// relies on an order CUDA does not promise (a missing __syncthreads) answers differently.
//
// A broken kernel ends the process with one line naming the kernel, the block and the thread:
// a barrier or warp collective that can never complete, a mask that names an exited lane or
// leaves out the caller, a shuffle reading a lane outside its mask, a pointer argument that is
// not device (or pinned) memory. The CUDA runtime, cuBLAS and NCCL calls the backend makes are
// emulated in runtime.cpp, cublas.cpp and nccl.cpp beside this file.
//
// What it cannot see: races between blocks (they run one after another; a race shows only as an
// answer that depends on the block order), timing and true overlap (async streams reorder work,
// they do not run it at the same time), memory
// coalescing, bank conflicts, occupancy and register spills (make cuda-report), and arithmetic
// that differs on the device (fused multiply-adds, the accuracy of expf, tensor-core rounding).
#include <cuda_runtime.h>  // all of it before the macros below (nccl.h includes it too)

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "device/emu/races.hpp"

// The CUDA headers make __shared__ empty for a host compiler: a bare one would declare storage of
// each thread, unpoisoned. Static shared memory is declared with TESSERA_SHARED instead.
#undef __shared__
#define __shared__ __shared___use_TESSERA_SHARED

namespace tessera::emu {

struct Coords {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
// The running CUDA thread's coordinates (set by the scheduler before it resumes a fiber).
extern thread_local Coords g_at;

void syncthreads();
// A warp collective of the calling lane: it offers `value` and, once every lane of `mask` has
// arrived, gets the value offered by lane `src` (which must be in the mask).
uint64_t warp_collective(unsigned mask, uint64_t value, int src, const char* what);
// The calling thread's lane: its linear index in the block, modulo 32.
int lane_id();
// The launch's dynamic shared memory (the smem bytes given to launch), per block.
void* dynamic_shared();
// Fills `bytes` at p with 0xFF the first time a thread of the running block calls it for p: the
// static shared storage of TESSERA_SHARED, which the block before left holding its values.
void poison_shared(void* p, size_t bytes);

// Runs body(closure) as every thread of the grid (see above), when the stream gets to it
// (device/emu/streams.hpp: at once, or later in async mode; the closure holds the arguments by
// value, as a launch captures them). An invalid configuration sets the runtime's last error
// (cudaErrorInvalidConfiguration) at once, as a launch on a GPU does.
// `touches`: what its pointer arguments read and write, for the race detector (races.hpp).
using Body = void (*)(const void* closure);
void run_grid(const char* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              const std::vector<Touch>& touches, Body body, std::shared_ptr<const void> closure);
// Ends the run with "cuda emulator: kernel K: what" when p is neither null nor inside device or
// pinned memory (a host pointer handed to a kernel: an illegal address on a GPU).
void check_kernel_pointer(const char* kernel, int argument, const void* p);

template <typename T>
uint64_t to_bits(T x) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T x;
  std::memcpy(&x, &b, sizeof(T));
  return x;
}
// The source lane of a shuffle within segments of `width` lanes: outside its segment a lane reads
// itself, as on the device.
inline int in_segment(int lane, int src, int width) {
  return (src / width == lane / width && src >= 0) ? src : lane;
}

}  // namespace tessera::emu

#define threadIdx (::tessera::emu::g_at.thread)
#define blockIdx (::tessera::emu::g_at.block)
#define blockDim (::tessera::emu::g_at.block_dim)
#define gridDim (::tessera::emu::g_at.grid_dim)

inline void __syncthreads() { ::tessera::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::tessera::emu::warp_collective(mask, 0, ::tessera::emu::lane_id(), "__syncwarp");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = ::tessera::emu::lane_id();
  const int src = ::tessera::emu::in_segment(lane, lane ^ lane_mask, width);
  return ::tessera::emu::from_bits<T>(::tessera::emu::warp_collective(
      mask, ::tessera::emu::to_bits(var), src, "__shfl_xor_sync"));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = ::tessera::emu::lane_id();
  const int src = ::tessera::emu::in_segment(lane, lane + int(delta), width);
  return ::tessera::emu::from_bits<T>(::tessera::emu::warp_collective(
      mask, ::tessera::emu::to_bits(var), src, "__shfl_down_sync"));
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = ::tessera::emu::lane_id();
  const int src = ::tessera::emu::in_segment(lane, lane / width * width + src_lane % width, width);
  return ::tessera::emu::from_bits<T>(::tessera::emu::warp_collective(
      mask, ::tessera::emu::to_bits(var), src, "__shfl_sync"));
}
