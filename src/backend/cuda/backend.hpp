#pragma once
// The CUDA backend (backend/backend.hpp says what a backend is): F = float (fp32 throughout, for
// parity with the CPU) or bf16 (bf16 parameters and activations, fp32 master weights, gradients
// and moments), cuBLAS and the kernels of this folder on one stream, the collectives over NCCL.
#include "backend/backend.hpp"
#include "backend/cuda/ops.hpp"
#include "parallel/nccl_comm.hpp"

namespace tessera {

template <typename F>
struct CudaBackend {
  using Act = F;
  using Comm = NcclComm;
  static constexpr bool kHostMemory = false;
  // The LM head over the padded vocabulary rows: aligned leading dimensions for cuBLAS, and no
  // GEMM with K = 0 on a rank that holds only padding.
  static constexpr bool kAlignedHead = true;
  TESSERA_BACKEND_FUNCTIONS(cuda)
};

}  // namespace tessera
