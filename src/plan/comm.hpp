#pragma once
// Bytes one rank hands to each communicator per optimizer step, and the pipeline bubble: the
// counts of docs/formulas.md for tessera's own collectives (the payload the engine's
// payload_bytes counters measure; tests/integration/test_comm_volume.sh holds them equal).
#include <cstdint>

#include "config/config.hpp"
#include "engine/run_layout.hpp"
#include "parallel/traffic.hpp"

namespace tessera {

struct CommBytes {
  // Payload bytes per step by group, named as the trainer's counters (parallel/traffic.hpp); cp:
  // context parallelism's K/V blocks (ring or all-gather).
  TrafficBytes payload;
  // The data-parallel bytes each rank puts on the wire per step (ring algorithms): an
  // all-reduce 2 (n-1)/n of its payload, a reduce-scatter or all-gather (n-1)/n.
  double dp_traffic = 0;
  // The dp payload by collective: reduce-scattered or all-gathered over the ZeRO shard group (n
  // ranks), and all-reduced over the dp group (ZeRO-0, or no sharding) or across replicas (r).
  double dp_sharded = 0, dp_all_reduce = 0;
  // Of the tp payload, the MoE layers' gates' gradients (fp32, N k a layer and micro-batch, summed
  // in the backward); of the cp payload, their router statistics (2 E + 2 doubles, summed in
  // each forward, a full recompute's rerun too); with whole experts (parallel.expert_tp = 1) of
  // the tp payload the same statistics summed over tp (moe_stats_tp).
  double moe_gates = 0, moe_stats = 0, moe_stats_tp = 0;
  // Expert parallelism: of the dp payload, the experts' gradients, all-reduced over the edp ranks
  // holding the same experts (dp x cp / ep of them) where the rest sums over dp x cp; and the ep
  // payload's all-to-alls (exchanges) per micro-batch.
  double dp_experts = 0, ep_exchanges = 0;
};

// The rank at (tp_rank, pp_rank) of `run` (dp ranks alike); act_bytes: an activation's size (4,
// or 2 in bf16); param_buffer: its gradient buffer's elements (DistributedOptimizer::buffer_size).
// dp by ZeRO stage (parallel.zero; n the shard group, r = dp / n its replicas, P the buffer, S
// the rank's parts, U the tile's units each padded to n parts, m micro-batches):
//   0  one all-reduce of P (fp32)
//   1  a reduce-scatter and an all-gather of P; the slice all-reduced across replicas
//   2  per micro-batch a reduce-scatter of every unit's gradients (fp32); after the update an
//      all-gather of every unit's parameters
//   3  per micro-batch every unit's parameters gathered for its forward and again for its
//      backward (not with reshard_after_forward = false: once per step), and its gradients
//      reduce-scattered; 2 and 3 then all-reduce S across replicas
// Expert parallelism: the experts' part of P sums over edp. ZeRO-1 with ep sums as 0 does, then
// all-gathers every unit padded to its group's parts (the experts' units over edp) of the
// parameters (act_bytes each), as 2's gather after the update.
// ep, per MoE layer and micro-batch (model/moe_layer.hpp): the rows routed to the other ep
// ranks' experts sent out and their outputs received back, the backward the same with gradients,
// a full recompute's rerun its forward's two again: (ep - 1) / ep of the k b T rows of C
// activations each way when the load is balanced (at most each expert's capacity), the trainer's
// own rows not counted (FORMULAS.md).
CommBytes comm_bytes(const Config& cfg, const ModelShape& shape, const RunLayout& run, int pp_rank,
                     uint64_t param_buffer, int act_bytes);

// The idle fraction of each stage: (pp - 1) / (v m + pp - 1).
double pipeline_bubble(const RunLayout& run);

// The elements one ring all-reduce / reduce-scatter + all-gather of `payload` bytes over n ranks
// moves per rank (2 (n - 1) / n of it).
inline double ring_traffic(double payload, int n) { return n > 1 ? 2.0 * (n - 1) / n * payload : 0; }

}  // namespace tessera
