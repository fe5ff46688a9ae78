#pragma once
// What a resolved (dp, tp, pp) layout makes of a deck: the micro-batches, each stage's layer
// chunks, each rank's tile, schedule and engine set-up, and the loader's ring. The trainer and
// `tessera plan` both build a run from these, so the plan counts the run the trainer would make.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "engine/engine.hpp"
#include "model/param_layout.hpp"
#include "model/shard.hpp"
#include "parallel/layout.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

struct RunLayout {
  ParallelLayout layout;
  int micro_batch = 0;  // sequences per forward/backward per dp rank
  int n_micro = 0;      // micro-batches per step per dp rank
  int virtual_stages = 1;
  std::vector<std::vector<LayerRange>> stage_chunks;  // by pp rank: its layer chunks
};

// The checks a resolved layout must pass against the deck (check_layout, the tensor-parallel
// splits of the model, sequence parallelism's rows, the virtual stages' groups) and, when they
// pass, *out. Returns "" or one message naming the keys and numbers (without the deck's name).
std::string make_run_layout(const Config& cfg, const ModelShape& shape,
                            const ParallelLayout& layout, RunLayout* out);

// The tile of the rank at (tp_rank, pp_rank, ep_rank), and its stage's schedule.
LocalLayout rank_tile(const RunLayout& run, const ModelShape& shape, int tp_rank, int pp_rank,
                      int ep_rank = 0);
std::vector<Action> rank_schedule(const Config& cfg, const RunLayout& run, int pp_rank);

// What the engine of the rank at pp_rank holding `tile` is built from, without a mesh: the plan
// counts the engine so, the trainer gives it the run's.
// optim.*: the update rule and its hyper-parameters (optim/rule.hpp).
OptimHyper optim_hyper(const OptimConfig& optim);
EngineSetup engine_setup(const Config& cfg, const RunLayout& run, const LocalLayout& tile,
                         int pp_rank);

// Host bytes of the data loader's ring on a rank that reads tokens (the first or last stage):
// data.prefetch steps (at least one) of tokens and targets.
uint64_t loader_ring_bytes(const Config& cfg, const RunLayout& run);

}  // namespace tessera
