#pragma once
// The layout of the world's ranks (docs/architecture.md): the sizes a deck resolves to, the checks they must
// pass before anything is allocated, and the mesh they make (parallel/mesh_shape.hpp; the
// communicators are parallel/mesh.hpp's).
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "parallel/mesh_shape.hpp"

namespace tessera {

struct ParallelLayout {
  int dp = 1, tp = 1, pp = 1;
  // ZeRO shards over groups of this many consecutive dp x cp ranks (hybrid sharding), replicated
  // across the dpcp / zero_group groups; 0 = dp x cp (one group).
  int zero_group = 0;
  int cp = 1;  // context parallelism: each sequence split over cp ranks (docs/architecture.md)
  // Expert parallelism: the experts of each MoE layer split over groups of ep consecutive dp x cp
  // ranks (cp fastest), each group's ranks holding E / ep of them; edp = dp x cp / ep ranks hold
  // the same experts (their gradients reduce over them).
  int ep = 1;
  // parallel.expert_tp = 1 with tp > 1: every tp rank holds whole experts and routes its own
  // sequence-parallel rows; the ep groups are ep consecutive ranks of tp x cp x dp (tp fastest:
  // folded over tp), edp = tp x dp x cp / ep of them holding the same experts.
  bool experts_whole = false;
  // The ranks holding the same parameters (same tp, pp): their gradients reduce over them.
  int dpcp() const { return dp * cp; }
  int shard_size() const { return zero_group > 0 ? zero_group : dpcp(); }
};

// Resolves the `auto` (0) entry of cfg against the world size into *out. Returns "" or one
// message naming the numbers: "parallel: dp=2 x tp=2 x pp=2 = 8 ranks, but the job has 6",
// "parallel: world size 6 is not divisible by tp=4 x pp=1 (dp=auto)".
std::string resolve_layout(const ParallelConfig& cfg, int world_size, ParallelLayout* out);

// [first, last) layer range of each of the pp stages: stage_layers as given, or balanced when it is
// empty (the first n_layer % pp stages take one layer more).
std::vector<std::pair<int, int>> stage_layer_ranges(int n_layer, int pp,
                                                    const std::vector<int>& stage_layers);

// Everything a resolved layout must satisfy before any allocation: tp divides n_head and
// padded_vocab; every stage has >= 1 layer (pp <= n_layer, or stage_layers has pp positive
// entries summing to n_layer); batch_size is a positive multiple of dp * micro_batch, micro_batch
// being the per-rank micro-batch already resolved by the caller. Returns "" or the first problem
// as one message naming the numbers ("parallel.tp = 3 does not divide model.n_head = 4").
std::string check_layout(const ParallelLayout& layout, int n_head, int padded_vocab, int n_layer,
                         const std::vector<int>& stage_layers, int batch_size, int micro_batch);

// "" or the one line refusing ZeRO groups (parallel.zero_group) that cut an expert-parallel
// group: resolve_layout's check, for layouts made without it (the planner's search).
std::string check_expert_groups(const ParallelLayout& layout);

// The mesh of a layout (docs/architecture.md): the one place the world's axes are named, fastest first,
//   tp, cp, dp, pp
// with ZeRO's view of dp x cp: `shard`, the zero_group consecutive ranks of dp x cp (cp fastest)
// that split the optimizer's state, and `replica`, the ranks holding the same shard in the other
// groups (with one group: shard = dp x cp, replica = 1). Adding an axis: a name here, its
// divisibility rules (check_layout, make_run_layout), and the code that asks for its group.
MeshShape mesh_shape(const ParallelLayout& layout);
// With ep > 1 the mesh also cuts dp x cp into ep (fastest), eshard and ereplica: the ranks holding
// the same experts (edp) are group({"eshard", "ereplica"}); eshard alone, the ranks of one ZeRO
// group among them, splits the experts' ZeRO state.

// One line per world rank, for rank 0 to print (no newline after the last):
//   "rank 5: dp 0 tp 1 pp 1  layers 2-3 (+ wte copy, ln_f)"
// Coordinates slowest first, the stage last (the layers follow it); a dimension of one rank is
// left out unless every run has it (dp, tp, pp): "rank 5: dp 1 cp 0 tp 1 pp 0 ..." with cp = 2.
// stage_chunks: each stage's [first, last) layer ranges (one, or one per virtual stage:
// "layers 2-3, 6-7"); the first stage's, the last stage's and a lone stage's other tensors.
std::string rank_grid(const MeshShape& mesh,
                      const std::vector<std::vector<std::pair<int, int>>>& stage_chunks,
                      const std::string& first_extra, const std::string& last_extra,
                      const std::string& both_extra);

}  // namespace tessera
