#pragma once
// Bytes one rank hands to each communicator per optimizer step, and the pipeline bubble: the
// counts of ../shared/FORMULAS.md for tessera's own collectives (the payload the engine's
// payload_bytes counters measure; tests/integration/test_comm_volume.sh holds them equal).
#include <cstdint>

#include "config/config.hpp"
#include "engine/run_layout.hpp"

namespace tessera {

struct CommBytes {
  double tp = 0, dp = 0, pp = 0, embed = 0;  // payload bytes per step
};

// The rank at (tp_rank, pp_rank) of `run` (dp ranks alike); act_bytes: an activation's size (4,
// or 2 in bf16); param_buffer: its gradient buffer's elements (DistributedOptimizer::buffer_size).
CommBytes comm_bytes(const Config& cfg, const ModelShape& shape, const RunLayout& run, int pp_rank,
                     uint64_t param_buffer, int act_bytes);

// The idle fraction of each stage: (pp - 1) / (v m + pp - 1).
double pipeline_bubble(const RunLayout& run);

// The elements one ring all-reduce / reduce-scatter + all-gather of `payload` bytes over n ranks
// moves per rank (2 (n - 1) / n of it).
inline double ring_traffic(double payload, int n) { return n > 1 ? 2.0 * (n - 1) / n * payload : 0; }

}  // namespace tessera
