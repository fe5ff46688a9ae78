// The rank grid on one process: coordinates, layout resolution and checks with their exact
// messages, stage ranges, and a 1-rank Topology. tests/integration/test_topology_mpi.sh runs the
// communicators on 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "parallel/topology.hpp"

namespace tessera {
namespace {

TEST(Topology, RankOrderPutsTpFastestThenDpThenPp) {
  const ParallelLayout l{2, 2, 2};
  // world rank -> (dp, tp, pp), written out rather than computed.
  const int expected[8][3] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                              {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; r++) {
    RankCoord c = coord_of(r, l);
    EXPECT_EQ(c.dp_rank, expected[r][0]) << r;
    EXPECT_EQ(c.tp_rank, expected[r][1]) << r;
    EXPECT_EQ(c.pp_rank, expected[r][2]) << r;
  }
}

TEST(Topology, CoordRoundTripsForUnevenLayouts) {
  for (ParallelLayout l : {ParallelLayout{3, 2, 4}, ParallelLayout{1, 5, 1},
                           ParallelLayout{4, 1, 3}, ParallelLayout{1, 1, 1}}) {
    int n = l.dp * l.tp * l.pp;
    std::vector<int> seen(n, 0);
    for (int r = 0; r < n; r++) {
      RankCoord c = coord_of(r, l);
      EXPECT_GE(c.dp_rank, 0);
      EXPECT_LT(c.dp_rank, l.dp);
      EXPECT_LT(c.tp_rank, l.tp);
      EXPECT_LT(c.pp_rank, l.pp);
      EXPECT_EQ(world_rank_of(c, l), r);
      EXPECT_EQ(r, (c.pp_rank * l.dp + c.dp_rank) * l.tp + c.tp_rank);
      seen[world_rank_of(c, l)]++;
    }
    for (int r = 0; r < n; r++) EXPECT_EQ(seen[r], 1);
  }
}

ParallelConfig parallel(int dp, int tp, int pp) {
  ParallelConfig c;
  c.dp = dp;
  c.tp = tp;
  c.pp = pp;
  return c;
}

void expect_layout(const ParallelLayout& l, int dp, int tp, int pp) {
  EXPECT_EQ(l.dp, dp);
  EXPECT_EQ(l.tp, tp);
  EXPECT_EQ(l.pp, pp);
}

TEST(Topology, ResolveLayoutFillsTheAutoEntry) {
  ParallelLayout l;
  EXPECT_EQ(resolve_layout(parallel(2, 2, 2), 8, &l), "");
  expect_layout(l, 2, 2, 2);
  EXPECT_EQ(resolve_layout(parallel(0, 2, 3), 12, &l), "");
  expect_layout(l, 2, 2, 3);
  EXPECT_EQ(resolve_layout(parallel(2, 0, 1), 8, &l), "");
  expect_layout(l, 2, 4, 1);
  EXPECT_EQ(resolve_layout(parallel(1, 2, 0), 6, &l), "");
  expect_layout(l, 1, 2, 3);
  EXPECT_EQ(resolve_layout(parallel(0, 1, 1), 1, &l), "");
  expect_layout(l, 1, 1, 1);
}

TEST(Topology, ResolveLayoutErrorsNameTheNumbers) {
  ParallelLayout l{7, 7, 7};
  EXPECT_EQ(resolve_layout(parallel(2, 2, 2), 6, &l),
            "parallel: dp=2 x tp=2 x pp=2 = 8 ranks, but the job has 6");
  EXPECT_EQ(resolve_layout(parallel(1, 1, 1), 2, &l),
            "parallel: dp=1 x tp=1 x pp=1 = 1 rank, but the job has 2");
  EXPECT_EQ(resolve_layout(parallel(0, 4, 1), 6, &l),
            "parallel: world size 6 is not divisible by tp=4 x pp=1 (dp=auto)");
  EXPECT_EQ(resolve_layout(parallel(3, 0, 2), 8, &l),
            "parallel: world size 8 is not divisible by dp=3 x pp=2 (tp=auto)");
  EXPECT_EQ(resolve_layout(parallel(2, 2, 0), 2, &l),
            "parallel: world size 2 is not divisible by dp=2 x tp=2 (pp=auto)");
  EXPECT_EQ(resolve_layout(parallel(0, 0, 2), 8, &l),
            "parallel: dp and tp are auto; at most one of dp, tp, pp may be auto");
  EXPECT_EQ(resolve_layout(parallel(0, 0, 0), 8, &l),
            "parallel: dp, tp and pp are auto; at most one of dp, tp, pp may be auto");
  EXPECT_EQ(resolve_layout(parallel(1, -2, 1), 2, &l), "parallel.tp = -2 must be >= 1 or auto");
  expect_layout(l, 7, 7, 7);  // untouched on error
}

using Ranges = std::vector<std::pair<int, int>>;

TEST(Topology, StageLayerRanges) {
  EXPECT_EQ(stage_layer_ranges(5, 2, {}), (Ranges{{0, 3}, {3, 5}}));
  EXPECT_EQ(stage_layer_ranges(8, 3, {}), (Ranges{{0, 3}, {3, 6}, {6, 8}}));
  EXPECT_EQ(stage_layer_ranges(7, 4, {}), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  EXPECT_EQ(stage_layer_ranges(4, 1, {}), (Ranges{{0, 4}}));
  EXPECT_EQ(stage_layer_ranges(4, 4, {}), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(stage_layer_ranges(8, 3, {1, 3, 4}), (Ranges{{0, 1}, {1, 4}, {4, 8}}));
  EXPECT_EQ(stage_layer_ranges(5, 2, {4, 1}), (Ranges{{0, 4}, {4, 5}}));
}

TEST(Topology, CheckLayoutAcceptsGoodLayouts) {
  EXPECT_EQ(check_layout({2, 2, 2}, 4, 64, 4, {}, 16, 2), "");
  EXPECT_EQ(check_layout({1, 1, 1}, 1, 1, 1, {}, 1, 1), "");
  EXPECT_EQ(check_layout({3, 4, 3}, 12, 50304, 12, {6, 3, 3}, 36, 4), "");
  EXPECT_EQ(check_layout({1, 1, 4}, 4, 64, 4, {}, 8, 8), "");
}

TEST(Topology, CheckLayoutErrorsNameTheNumbers) {
  // layout, n_head, padded_vocab, n_layer, stage_layers, batch_size, micro_batch
  EXPECT_EQ(check_layout({1, 3, 1}, 4, 64, 4, {}, 8, 8),
            "parallel.tp = 3 does not divide model.n_head = 4");
  EXPECT_EQ(check_layout({1, 4, 1}, 4, 50258, 4, {}, 8, 8),
            "parallel.tp = 4 does not divide the padded vocabulary Vp = 50258 (make "
            "model.vocab_multiple a multiple of 4)");
  EXPECT_EQ(check_layout({1, 1, 5}, 4, 64, 4, {}, 8, 8),
            "parallel.pp = 5 is more than model.n_layer = 4 (every stage needs at least one "
            "layer)");
  EXPECT_EQ(check_layout({1, 1, 2}, 4, 64, 4, {2, 1, 1}, 8, 8),
            "parallel.stage_layers = [2, 1, 1] has 3 entries, but parallel.pp = 2");
  EXPECT_EQ(check_layout({1, 1, 2}, 4, 64, 4, {4, 0}, 8, 8),
            "parallel.stage_layers = [4, 0] gives stage 1 no layers (every stage needs at least "
            "one)");
  EXPECT_EQ(check_layout({1, 1, 2}, 4, 64, 4, {3, 3}, 8, 8),
            "parallel.stage_layers = [3, 3] sums to 6, but model.n_layer = 4");
  // pp > n_layer is fine only through stage_layers, which then fails on its own terms.
  EXPECT_EQ(check_layout({1, 1, 5}, 4, 64, 4, {1, 1, 1, 1, 1}, 8, 8),
            "parallel.stage_layers = [1, 1, 1, 1, 1] sums to 5, but model.n_layer = 4");
  EXPECT_EQ(check_layout({4, 1, 1}, 4, 64, 4, {}, 2, 0),
            "train.batch_size = 2 is less than parallel.dp = 4 (every data-parallel rank needs at "
            "least one sequence per step)");
  EXPECT_EQ(check_layout({4, 1, 1}, 4, 64, 4, {}, 8, 4),
            "train.batch_size = 8 is less than parallel.dp = 4 x micro-batch 4 = 16");
  EXPECT_EQ(check_layout({2, 1, 1}, 4, 64, 4, {}, 12, 4),
            "train.batch_size = 12 is not a multiple of parallel.dp = 2 x micro-batch 4 = 8");
  EXPECT_EQ(check_layout({2, 1, 1}, 4, 64, 4, {}, 12, 0),
            "the micro-batch size must be >= 1, got 0");
  // The first problem wins: tp before stages before the batch.
  EXPECT_EQ(check_layout({3, 3, 9}, 4, 64, 4, {}, 1, 1),
            "parallel.tp = 3 does not divide model.n_head = 4");
  EXPECT_EQ(check_layout({3, 1, 9}, 4, 64, 4, {}, 1, 1),
            "parallel.pp = 9 is more than model.n_layer = 4 (every stage needs at least one "
            "layer)");
}

int comm_size(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  return n;
}

TEST(Topology, OneRankHasOneRankCommunicators) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  ASSERT_EQ(world_size, 1) << "the unit tests run on one rank";
  Topology topo(MPI_COMM_WORLD, ParallelLayout{1, 1, 1});
  EXPECT_EQ(topo.world_rank(), 0);
  EXPECT_EQ(topo.world_size(), 1);
  EXPECT_EQ(topo.world(), MPI_COMM_WORLD);
  expect_layout(topo.layout(), 1, 1, 1);
  EXPECT_EQ(topo.coord().dp_rank, 0);
  EXPECT_EQ(topo.coord().tp_rank, 0);
  EXPECT_EQ(topo.coord().pp_rank, 0);
  EXPECT_TRUE(topo.first_stage());
  EXPECT_TRUE(topo.last_stage());
  for (CommName name : {CommName::tp, CommName::dp, CommName::pp}) {
    MPI_Comm comm = topo.comm(name);
    ASSERT_NE(comm, MPI_COMM_NULL);
    EXPECT_NE(comm, MPI_COMM_WORLD);  // its own communicator, freed by ~Topology
    EXPECT_EQ(comm_size(comm), 1);
    int rank = -1;
    MPI_Comm_rank(comm, &rank);
    EXPECT_EQ(rank, 0);
  }
  // The three are distinct communicators, not one handle fetched three times.
  EXPECT_NE(topo.comm(CommName::tp), topo.comm(CommName::dp));
  EXPECT_NE(topo.comm(CommName::dp), topo.comm(CommName::pp));
  EXPECT_EQ(topo.comm(CommName::embed), MPI_COMM_NULL);
  EXPECT_EQ(topo.rank_grid({stage_layer_ranges(4, 1, {})}, "wte, wpe", "wte copy, ln_f",
                           "wte, wpe, ln_f"),
            "rank 0: dp 0 tp 0 pp 0  layers 0-3 (+ wte, wpe, ln_f)");
}

TEST(Topology, WrongWorldSizeIsRefused) {
  try {
    Topology topo(MPI_COMM_WORLD, ParallelLayout{2, 1, 1});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()), "parallel: dp=2 x tp=1 x pp=1 = 2 ranks, but the job has 1");
  }
}

// rank_grid lists every world rank from the layout alone, so a 1-rank Topology cannot show a
// bigger grid; the text format is checked on the 8-rank grid in test_topology_mpi.sh.
TEST(Topology, RankGridNamesSingleLayers) {
  Topology topo(MPI_COMM_WORLD, ParallelLayout{1, 1, 1});
  EXPECT_EQ(topo.rank_grid({{{0, 1}}}, "a", "b", "wte, wpe, ln_f"),
            "rank 0: dp 0 tp 0 pp 0  layer 0 (+ wte, wpe, ln_f)");
  // Virtual stages: one range per chunk.
  EXPECT_EQ(topo.rank_grid({{{0, 2}, {4, 5}}}, "a", "b", "c"),
            "rank 0: dp 0 tp 0 pp 0  layers 0-1, 4 (+ c)");
}

}  // namespace
}  // namespace tessera
