#pragma once
// The predicted time of one optimizer step (docs/planning.md states the model): every
// GEMM at the device's peak times an efficiency that falls with its smallest dimensions,
// memory-bound ops at the memory bandwidth, tensor-parallel collectives on the node's link,
// pipeline and data-parallel traffic on the link their ranks share (inside a node or not), the
// pipeline's fill and drain, and the overlap the trainer really has.
#include "backend/op_clock.hpp"
#include "config/config.hpp"
#include "engine/run_layout.hpp"
#include "plan/comm.hpp"
#include "plan/machine.hpp"

namespace tessera {

struct StepTime {
  double compute = 0;   // the slowest stage's GEMMs and memory-bound ops, all micro-batches
  double tp = 0;        // its tensor-parallel collectives
  double pp = 0;        // its sends and receives
  double bubble = 0;    // the pipeline's fill and drain
  double dp = 0;        // the exposed data-parallel reduction (and ZeRO-1's all-gather)
  double embed = 0;     // the tied embedding's gradient sum
  double cp = 0;        // context parallelism's K/V transfers the attention does not hide
  double ep = 0;        // expert parallelism's all-to-alls (blocking: nothing overlaps them)
  double optimizer = 0; // AdamW over the largest tile
  double total = 0;
  double tokens_per_s = 0;
  double model_flops = 0;  // per step, FORMULAS.md: 6 N_matmul + 12 L C T per token
  // per step, what the recompute reruns besides: full, the layers' forward (2 N_matmul of the
  // layers + 4 L C T per token; never the head's); selective, the attention core's 4 L C T
  double recompute_flops = 0;
  double mfu = 0;          // model FLOP/s over (ranks x peak)
  double attention = 0;    // the slowest stage's attention (cp: this rank's blocks), all micro-batches
  // The slowest stage's compute by the kinds the trainer's step breakdown times
  // (backend/op_clock.hpp; the optimizer is `optimizer` above), all micro-batches, and its kernel
  // launches: compute = their sum.
  op_clock::Seconds ops{};
  double launches = 0;
};

// param_buffer: the gradient buffer's elements on the largest tile (DistributedOptimizer).
StepTime step_time(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                   const Machine& machine, bool bf16, uint64_t param_buffer);

}  // namespace tessera
