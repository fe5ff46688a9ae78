#pragma once
// The CPU backend (backend/backend.hpp says what a backend is): fp32 on OpenBLAS and OpenMP,
// buffers in host memory, the collectives over MPI.
#include "backend/backend.hpp"
#include "backend/cpu/ops.hpp"
#include "parallel/comm.hpp"

namespace tessera {

struct CpuBackend {
  using Act = float;
  using Comm = tessera::Comm;
  static constexpr bool kHostMemory = true;
  static constexpr bool kAlignedHead = false;
  TESSERA_BACKEND_FUNCTIONS(cpu)
  // FP8 simulated (backend/cpu/fp8.cpp): no CUDA twins yet.
  TESSERA_BACKEND_FORWARD(cpu, fp8_amax)
  TESSERA_BACKEND_FORWARD(cpu, fp8_quantize)
  TESSERA_BACKEND_FORWARD(cpu, bias_backward)
};

}  // namespace tessera
