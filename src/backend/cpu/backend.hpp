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
};

}  // namespace tessera
