#pragma once
// The bytes one rank of a run allocates, counted from the engine's own declarations
// (engine/engine_memory.hpp over backend/declare.hpp): nothing is allocated and no communicator
// is needed, so `tessera plan` answers on a login node what `tessera train` will take.
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "engine/run_layout.hpp"

namespace tessera {

struct RankMemory {
  int pp_rank = 0, tp_rank = 0, dp_rank = 0;  // dp_rank: the place in dp x cp
  uint64_t param_elems = 0;  // the tile's parameters (LocalLayout::total)
  // The engine's arena, by what its buffers hold.
  uint64_t params = 0;       // fp32 master (padded to dp shards under ZeRO-1; this rank's slice or
                             // parts where it is sharded: bf16 ZeRO-1 and 2, ZeRO-3), plus the
                             // bf16 copy
  uint64_t grads = 0;        // fp32 gradients (the parts' sums under ZeRO-2/3)
  uint64_t optimizer = 0;    // the update rule's state (this rank's shard under ZeRO) and working
                             // buffers, the norm's accumulator
  uint64_t moments = 0;      // the rule's state alone (DistributedOptimizer::moment_bytes)
  uint64_t activations = 0;  // every chunk's kept activations and statistics (Gpt::activation_bytes)
  uint64_t transient = 0;    // ZeRO-2/3: gathered parameters and unit gradient buffers
  uint64_t fp8 = 0;          // device.precision fp8: the GEMM weights' codes and transposes
                             // (in params too)
  uint64_t pipeline = 0;     // the pipeline's backward send buffers (PipelineExecutor's pool)
  uint64_t other = 0;        // scratch, cross-entropy, pipeline send buffers, step token buffers
  uint64_t arena = 0;        // the sum: one allocation on the device (host on the CPU)
  uint64_t engine_host = 0;  // TrainEngine::host_bytes: the arena on the CPU plus host copies
  uint64_t loader = 0;       // the data loader's ring (first and last stage)
  uint64_t buffer_size = 0;  // floats in the optimizer's flat buffer (the dp gradient sum's payload)
  uint64_t state_size = 0;   // floats of master weights and moments this rank holds (the host
                             // state a checkpoint reads and writes)
  uint64_t checkpoint = 0;   // host copies for a checkpoint: the rule's state, and the parameters
                             // too for an asynchronous one (checkpoint.async)
  int in_flight = 0;         // micro-batch activation sets the schedule keeps (summed over chunks)
  // model.moe: of param_elems, the experts' (their fc1 and fc2 tensors; the router is dense,
  // replicated as the dense layers are); and the MoE layers' own buffers by their arena names
  // (model/moe_layer.cpp), the kept ones among the activations, the scratch among `other`.
  uint64_t expert_elems = 0;
  static constexpr int kMoeBuffers = 6;
  static constexpr const char* kMoeBufferNames[kMoeBuffers] = {
      "experts' activations", "router scores and gates", "dispatch maps",
      "experts' scratch",     "router scratch",          "router statistics"};
  uint64_t moe_buffers[kMoeBuffers] = {};
  uint64_t host() const { return engine_host + loader + checkpoint; }
};

// The rank world_rank of `run`'s mesh (parallel/layout.hpp), with an engine of `kind`: on a GPU
// the arena is device memory; bf16: CUDA's bf16 activations and parameter copy.
RankMemory rank_memory(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                       long long world_rank, EngineKind kind);

// "rank 0 (stage 0, tp 0): parameters 497.8 MB, gradients ..., total 2.1 GB" for logs.
std::string memory_line(const RankMemory& m, const std::string& total_of = "");

}  // namespace tessera
