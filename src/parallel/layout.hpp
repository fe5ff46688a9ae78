#pragma once
// The rank grid (DESIGN §3): which (dp, cp, tp, pp) coordinate each world rank has, the checks a
// layout must pass before anything is allocated, and the communicators, built once.
//
// Rank order puts tp fastest, then cp, then dp, then pp (tp stays inside a node, pp crosses
// nodes):
//   world_rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"

namespace tessera {

struct ParallelLayout {
  int dp = 1, tp = 1, pp = 1;
  // ZeRO shards over groups of this many consecutive dp x cp ranks (hybrid sharding), replicated
  // across the dpcp / zero_group groups; 0 = dp x cp (one group).
  int zero_group = 0;
  int cp = 1;  // context parallelism: each sequence split over cp ranks (DESIGN §3)
  // The ranks holding the same parameters (same tp, pp): their gradients reduce over them.
  int dpcp() const { return dp * cp; }
  int shard_size() const { return zero_group > 0 ? zero_group : dpcp(); }
};

struct RankCoord {
  int dp_rank = 0, tp_rank = 0, pp_rank = 0, cp_rank = 0;
  // The rank in the dp x cp group (dpcp communicator): cp fastest.
  int dpcp_rank(const ParallelLayout& l) const { return dp_rank * l.cp + cp_rank; }
};

RankCoord coord_of(int world_rank, const ParallelLayout& layout);
int world_rank_of(const RankCoord& coord, const ParallelLayout& layout);

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

// shard: the ZeRO group within dp x cp (ranks dpcp_rank / zero_group alike, by dpcp rank);
// replica: the ranks holding the same shard in the other groups (dpcp_rank % zero_group alike).
// With one group shard has dpcp's ranks and replica is this rank alone. cp: the ranks splitting
// one sequence (same dp, tp, pp), by cp rank; dpcp: the ranks holding the same parameters (same
// tp, pp), by dpcp rank, which the gradients reduce over: dp's ranks in dp's order when cp = 1.
enum class CommName { tp, dp, pp, embed, shard, replica, cp, dpcp };
inline constexpr int kCommNames = 8;

class Topology {
 public:
  // Collective over world, whose size must be dp * cp * tp * pp: one MPI_Comm_split per communicator.
  Topology(MPI_Comm world, const ParallelLayout& layout);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const ParallelLayout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  const RankCoord& coord() const { return coord_; }
  MPI_Comm world() const { return world_; }

  // tp: ranks of the same (dp, pp), ordered by tp_rank; dp: same (tp, pp), by dp_rank; pp: same
  // (tp, dp), by pp_rank; embed: the first and the last stage of the same (tp, dp), first stage
  // first (the tied wte's gradient), MPI_COMM_NULL on middle stages and when pp == 1.
  MPI_Comm comm(CommName name) const { return comms_[static_cast<int>(name)]; }

  bool first_stage() const { return coord_.pp_rank == 0; }
  bool last_stage() const { return coord_.pp_rank == layout_.pp - 1; }

  // One line per world rank, for rank 0 to print (no newline after the last):
  //   "rank 5: dp 0 tp 1 pp 1  layers 2-3 (+ wte copy, ln_f)" (with cp > 1 "dp 0 cp 1 tp 1 ...")
  // stage_chunks: each stage's [first, last) layer ranges (one, or one per virtual stage:
  // "layers 2-3, 6-7"); the first stage's, the last stage's and a lone stage's other tensors.
  std::string rank_grid(const std::vector<std::vector<std::pair<int, int>>>& stage_chunks,
                        const std::string& first_extra, const std::string& last_extra,
                        const std::string& both_extra) const;

 private:
  ParallelLayout layout_;
  RankCoord coord_;
  int world_rank_ = 0, world_size_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm comms_[kCommNames] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL,
                                 MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
};

}  // namespace tessera
