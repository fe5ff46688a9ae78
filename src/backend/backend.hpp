#pragma once
// What a backend gives the code above the ops. The model (model/gpt), the pipeline executor
// (pipeline/executor), the distributed optimizer (optim/distributed) and the train engine
// (engine/engine) are written once, as templates over a backend B:
//
//   B::Act        the type of activations and of the parameters the ops read: float, or bf16 on
//                 CUDA (parameter gradients, norm statistics, losses and the optimizer's
//                 master weights and moments are fp32 on every backend)
//   B::Comm       the communicator the model's collectives and the pipeline's transfers go
//                 through: Comm (MPI, parallel/comm.hpp) or NcclComm; the same named calls
//   B::kHostMemory  true when the backend's buffers are host memory, so nothing is copied in or
//                 out (checkpoints, initialisation)
//   B::kAlignedHead true when the LM head's GEMMs run over the padded vocabulary rows (aligned
//                 leading dimensions; the cross-entropy masks the padding), false for only the
//                 real rows
//   B::op(...)    every function of TESSERA_BACKEND_FUNCTIONS below, forwarded to the namespace
//                 of the backend, where each has the same signature (for Act = float) on both:
//                 the op set of backend/cpu/ops.hpp and backend/cuda/ops.hpp, and
//                   memory()          the Allocator of the backend's Arena
//                   loader_memory()   the Allocator of the data loader's ring (pinned on a GPU)
//                   zero(p, bytes), copy(dst, src, bytes)      on backend memory, queued
//                   to_host(dst, src, bytes), to_device(...)   to/from host memory, complete on
//                                                              return
//                   upload(dst, src, bytes), await_uploads()   the step's tokens from the loader
//                                                              ring, overlapped with compute
//                   sync()            waits for everything queued (a no-op on the CPU)
//                   op_events(on)     the step breakdown's ops timed by events on the stream
//                                     (a GPU's), or by host clocks (the CPU's: a no-op)
//                   poison(p, bytes)  0xFF (NaN) over a buffer every step overwrites, in the
//                                     CUDA emulator only (a no-op elsewhere): a kernel reading
//                                     what this step did not write reads NaN, not last step's
//                   memory_report(arena, bf16), peak_gflops(bf16, fp8)   for the start-up log
//                   fp8_amax, fp8_cast, fp8_place, fp8_gemm, fp8_report, bias_backward   the FP8 GEMMs
//                                     (device.precision fp8, model/fp8.hpp)
//                   experts_forward/backward   a mixture of experts' held linear layers, each on
//                                     its block of rows (grouped on CUDA: device.expert_gemm)
//                   moe_route_forward/backward, moe_router_stats, moe_gather_rows, moe_combine,
//                                     moe_combine_backward   mixture of experts' router and
//                                     dispatch (backend/moe_routing.hpp)
//
// CpuBackend is in backend/cpu/backend.hpp, CudaBackend<float | bf16> in backend/cuda/backend.hpp.

#include <utility>

#include "backend/op_clock.hpp"

#define TESSERA_BACKEND_FORWARD(ns, fn)                                                          \
  template <typename... A>                                                                       \
  static decltype(auto) fn(A&&... a) {                                                           \
    return ns::fn(std::forward<A>(a)...);                                                        \
  }

// The same, timed into the op clock's slot (backend/op_clock.hpp: kGemm, the GEMMs of the linear
// layer the model named).
#define TESSERA_BACKEND_TIMED(ns, fn, slot)                                                      \
  template <typename... A>                                                                       \
  static decltype(auto) fn(A&&... a) {                                                           \
    const ::tessera::op_clock::Scope timed(::tessera::op_clock::slot);                           \
    return ns::fn(std::forward<A>(a)...);                                                        \
  }

#define TESSERA_BACKEND_FUNCTIONS(ns)                                                            \
  TESSERA_BACKEND_TIMED(ns, encoder_forward, kEmbedding)                                         \
  TESSERA_BACKEND_TIMED(ns, encoder_backward, kEmbedding)                                        \
  TESSERA_BACKEND_TIMED(ns, layernorm_forward, kNorms)                                           \
  TESSERA_BACKEND_TIMED(ns, layernorm_backward, kNorms)                                          \
  TESSERA_BACKEND_TIMED(ns, rmsnorm_forward, kNorms)                                             \
  TESSERA_BACKEND_TIMED(ns, rmsnorm_backward, kNorms)                                            \
  TESSERA_BACKEND_TIMED(ns, qk_norm_forward, kNorms)                                             \
  TESSERA_BACKEND_TIMED(ns, qk_norm_backward, kNorms)                                            \
  TESSERA_BACKEND_TIMED(ns, matmul_forward, kGemm)                                               \
  TESSERA_BACKEND_TIMED(ns, bias_add, kElementwise)                                              \
  TESSERA_BACKEND_TIMED(ns, bias_backward, kElementwise)                                         \
  TESSERA_BACKEND_TIMED(ns, fp8_amax, kFp8Casts)                                                 \
  TESSERA_BACKEND_TIMED(ns, fp8_cast, kFp8Casts)                                                 \
  TESSERA_BACKEND_TIMED(ns, fp8_place, kFp8Casts)                                                \
  TESSERA_BACKEND_TIMED(ns, fp8_gemm, kGemm)                                                     \
  TESSERA_BACKEND_FORWARD(ns, fp8_report)                                                        \
  TESSERA_BACKEND_TIMED(ns, matmul_backward, kGemm)                                              \
  TESSERA_BACKEND_TIMED(ns, experts_forward, kGemm)                                              \
  TESSERA_BACKEND_TIMED(ns, experts_backward, kGemm)                                             \
  TESSERA_BACKEND_TIMED(ns, attention_forward, kAttention)                                       \
  TESSERA_BACKEND_TIMED(ns, attention_backward, kAttention)                                      \
  TESSERA_BACKEND_TIMED(ns, attention_fused_forward, kAttention)                                 \
  TESSERA_BACKEND_TIMED(ns, attention_fused_backward, kAttention)                                \
  TESSERA_BACKEND_TIMED(ns, attention_block_forward, kAttention)                                 \
  TESSERA_BACKEND_TIMED(ns, attention_delta, kAttention)                                         \
  TESSERA_BACKEND_TIMED(ns, attention_block_backward, kAttention)                                \
  TESSERA_BACKEND_TIMED(ns, rope_forward, kElementwise)                                          \
  TESSERA_BACKEND_TIMED(ns, rope_backward, kElementwise)                                         \
  TESSERA_BACKEND_TIMED(ns, gelu_forward, kElementwise)                                          \
  TESSERA_BACKEND_TIMED(ns, gelu_backward, kElementwise)                                         \
  TESSERA_BACKEND_TIMED(ns, swiglu_forward, kElementwise)                                        \
  TESSERA_BACKEND_TIMED(ns, swiglu_backward, kElementwise)                                       \
  TESSERA_BACKEND_TIMED(ns, moe_route_forward, kRouting)                                         \
  TESSERA_BACKEND_TIMED(ns, moe_route_backward, kRouting)                                        \
  TESSERA_BACKEND_TIMED(ns, moe_router_stats, kRouting)                                          \
  TESSERA_BACKEND_TIMED(ns, moe_gather_rows, kRouting)                                           \
  TESSERA_BACKEND_TIMED(ns, moe_combine, kRouting)                                               \
  TESSERA_BACKEND_TIMED(ns, moe_combine_backward, kRouting)                                      \
  TESSERA_BACKEND_TIMED(ns, residual_forward, kElementwise)                                      \
  TESSERA_BACKEND_TIMED(ns, add_inplace, kElementwise)                                           \
  TESSERA_BACKEND_TIMED(ns, copy_columns, kElementwise)                                          \
  TESSERA_BACKEND_TIMED(ns, add_columns, kElementwise)                                           \
  TESSERA_BACKEND_TIMED(ns, fill, kElementwise)                                                  \
  TESSERA_BACKEND_TIMED(ns, crossentropy_row_max, kCrossEntropy)                                 \
  TESSERA_BACKEND_TIMED(ns, crossentropy_exp_sums, kCrossEntropy)                                \
  TESSERA_BACKEND_TIMED(ns, crossentropy_finish, kCrossEntropy)                                  \
  TESSERA_BACKEND_TIMED(ns, crossentropy_backward, kCrossEntropy)                                \
  TESSERA_BACKEND_TIMED(ns, adamw_update, kOptimizer)                                            \
  TESSERA_BACKEND_TIMED(ns, adafactor_sums, kOptimizer)                                          \
  TESSERA_BACKEND_TIMED(ns, adafactor_factors, kOptimizer)                                       \
  TESSERA_BACKEND_TIMED(ns, adafactor_rms, kOptimizer)                                           \
  TESSERA_BACKEND_TIMED(ns, adafactor_update, kOptimizer)                                        \
  TESSERA_BACKEND_TIMED(ns, sum_of_squares, kOptimizer)                                          \
  TESSERA_BACKEND_TIMED(ns, scale, kElementwise)                                                 \
  TESSERA_BACKEND_FORWARD(ns, memory)                                                            \
  TESSERA_BACKEND_FORWARD(ns, loader_memory)                                                     \
  TESSERA_BACKEND_FORWARD(ns, zero)                                                              \
  TESSERA_BACKEND_FORWARD(ns, copy)                                                              \
  TESSERA_BACKEND_FORWARD(ns, to_host)                                                           \
  TESSERA_BACKEND_FORWARD(ns, to_device)                                                         \
  TESSERA_BACKEND_FORWARD(ns, upload)                                                            \
  TESSERA_BACKEND_FORWARD(ns, await_uploads)                                                     \
  TESSERA_BACKEND_FORWARD(ns, sync)                                                              \
  TESSERA_BACKEND_FORWARD(ns, op_events)                                                         \
  TESSERA_BACKEND_FORWARD(ns, poison)                                                            \
  TESSERA_BACKEND_FORWARD(ns, memory_report)                                                     \
  TESSERA_BACKEND_FORWARD(ns, peak_gflops)
