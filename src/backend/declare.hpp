#pragma once
// A backend that only declares buffers: the element type of its activations and nothing to run.
// `tessera plan` builds an engine's declarations over it (engine/engine_memory.hpp) to count the
// bytes a run of any precision would allocate, on a machine with neither the device nor the
// ranks. Only the constructors of Gpt, DistributedOptimizer and PipelineExecutor are
// instantiated for it (model/gpt.cpp, optim/distributed.cpp, pipeline/executor.cpp).
#include <cstdint>

#include "backend/arena.hpp"
#include "parallel/comm.hpp"

namespace tessera {

// What a bf16 activation occupies (the CUDA backend's __nv_bfloat16, unavailable without CUDA).
struct Bf16Bytes {
  uint16_t bits;
};

template <class A>
struct DeclareBackend {
  using Act = A;
  using Comm = tessera::Comm;
  static constexpr bool kHostMemory = true;
  static constexpr bool kAlignedHead = false;
  static Allocator memory() { return {}; }
};

}  // namespace tessera
