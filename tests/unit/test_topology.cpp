// The rank mesh on one process: coordinates and groups of bigger meshes (by brute force), layout
// resolution and checks with their exact messages, stage ranges, and a 1-rank Mesh.
// tests/integration/test_topology_mpi.sh runs the communicators on 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "parallel/layout.hpp"
#include "parallel/mesh.hpp"

namespace tessera {
namespace {

TEST(Mesh, RankOrderPutsTpFastestThenDpThenPp) {
  const MeshShape m = mesh_shape(ParallelLayout{2, 2, 2});
  // world rank -> (dp, tp, pp), written out rather than computed.
  const int expected[8][3] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                              {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; r++) {
    EXPECT_EQ(m.coord(r, "dp"), expected[r][0]) << r;
    EXPECT_EQ(m.coord(r, "tp"), expected[r][1]) << r;
    EXPECT_EQ(m.coord(r, "pp"), expected[r][2]) << r;
    EXPECT_EQ(m.coord(r, "cp"), 0) << r;
  }
  EXPECT_EQ(m.describe(), "tp=2 x cp=1 x dp=2 x pp=2");
}

TEST(Mesh, CoordRoundTripsForUnevenLayouts) {
  for (ParallelLayout l : {ParallelLayout{3, 2, 4}, ParallelLayout{1, 5, 1},
                           ParallelLayout{4, 1, 3}, ParallelLayout{1, 1, 1},
                           ParallelLayout{2, 3, 2, 0, 3}}) {
    const MeshShape m = mesh_shape(l);
    const int n = l.dp * l.tp * l.pp * l.cp;
    ASSERT_EQ(m.world_size(), n);
    std::vector<int> seen(n, 0);
    for (int r = 0; r < n; r++) {
      const int dp = m.coord(r, "dp"), tp = m.coord(r, "tp"), pp = m.coord(r, "pp"),
                cp = m.coord(r, "cp");
      EXPECT_LT(dp, l.dp);
      EXPECT_LT(tp, l.tp);
      EXPECT_LT(pp, l.pp);
      EXPECT_LT(cp, l.cp);
      // The order DESIGN §3 writes out: tp fastest, then cp, dp, pp.
      EXPECT_EQ(r, ((pp * l.dp + dp) * l.cp + cp) * l.tp + tp);
      const long long back = m.rank_at({{"tp", tp}, {"cp", cp}, {"dp", dp}, {"pp", pp}});
      ASSERT_GE(back, 0);
      ASSERT_LT(back, n);
      seen[size_t(back)]++;
      EXPECT_EQ(back, r);
    }
    for (int r = 0; r < n; r++) EXPECT_EQ(seen[r], 1);
  }
}

// Every group of a 3 x 2 x 2 x 2 mesh (cp = 2) holds exactly the ranks that share the other
// coordinates, ordered by the named ones (mixed radix, mesh order): checked by brute force.
TEST(Mesh, GroupsHoldTheRanksThatDifferOnlyInTheirDimensions) {
  const ParallelLayout l{2, 3, 2, 2, 2};  // dp 2, tp 3, pp 2, zero_group 2, cp 2
  const MeshShape m = mesh_shape(l);
  const std::vector<DimNames> groups = {{"tp"},       {"cp"},       {"dp"},           {"pp"},
                                        {"dp", "cp"}, {"tp", "pp"}, {"cp", "dp", "pp"}};
  for (const DimNames& g : groups) {
    for (long long r = 0; r < m.world_size(); ++r) {
      std::vector<long long> members;
      for (long long q = 0; q < m.world_size(); ++q) {
        bool same = true;
        for (const MeshDim& d : m.dims())
          if (std::find(g.begin(), g.end(), d.name) == g.end() &&
              m.coord(q, d.name) != m.coord(r, d.name))
            same = false;
        if (same) members.push_back(q);
      }
      ASSERT_EQ(m.group_size(g), int(members.size()));
      // members are in world order, which for whole dimensions is the group's order too.
      const auto at = std::find(members.begin(), members.end(), r) - members.begin();
      EXPECT_EQ(m.group_rank(r, g), at) << m.group_name(g) << " rank " << r;
      for (long long q : members) EXPECT_EQ(m.group_color(q, g), m.group_color(r, g));
      for (long long q = 0; q < m.world_size(); ++q) {
        if (std::find(members.begin(), members.end(), q) == members.end()) {
          EXPECT_NE(m.group_color(q, g), m.group_color(r, g));
        }
      }
    }
  }
  EXPECT_EQ(m.group_name({"dp", "cp"}), "dpcp");
  EXPECT_EQ(m.group_name({"cp", "dp"}), "dpcp");
  EXPECT_EQ(m.group_size({"dp", "cp"}), 4);
}

// ZeRO's view: shard = zero_group consecutive ranks of dp x cp (cp fastest), replica = the ranks
// at the same place in the other groups.
TEST(Mesh, ZeroViewCutsDpTimesCp) {
  const ParallelLayout l{4, 2, 1, 2, 1};  // dp 4, tp 2, zero_group 2
  const MeshShape m = mesh_shape(l);
  EXPECT_EQ(m.size("shard"), 2);
  EXPECT_EQ(m.size("replica"), 2);
  for (long long r = 0; r < 8; ++r) {
    const int dpcp = m.group_rank(r, {"dp", "cp"});
    EXPECT_EQ(m.coord(r, "shard"), dpcp % 2) << r;
    EXPECT_EQ(m.coord(r, "replica"), dpcp / 2) << r;
    EXPECT_EQ(m.group_rank(r, {"shard"}), dpcp % 2);
    EXPECT_EQ(m.group_rank(r, {"replica"}), dpcp / 2);
  }
  // Ranks 0 and 2 (tp 0, dp 0 and 1) share a shard group, 0 and 4 (dp 0 and 2) a replica group.
  EXPECT_EQ(m.group_color(0, {"shard"}), m.group_color(2, {"shard"}));
  EXPECT_NE(m.group_color(0, {"shard"}), m.group_color(4, {"shard"}));
  EXPECT_EQ(m.group_color(0, {"replica"}), m.group_color(4, {"replica"}));
  // Both parts together are the ranks of dp x cp, in its order: one group, one name.
  EXPECT_EQ(m.group_name({"shard", "replica"}), "dpcp");
  EXPECT_EQ(m.group_name({"tp", "replica", "shard"}), "dpcptp");
  // Without hybrid sharding one shard group is dp x cp.
  EXPECT_EQ(mesh_shape(ParallelLayout{4, 2, 1}).size("shard"), 4);
  EXPECT_EQ(mesh_shape(ParallelLayout{4, 2, 1}).size("replica"), 1);
}

TEST(Mesh, ExpertViewCutsTheHoldersOfAnExpertByZeroGroup) {
  // dp 8, tp 1, zero_group 4, ep 2: eshard = 4 / 2 ranks of one ZeRO group hold the same experts,
  // ereplica = 8 / 4 groups hold the same parts (the replica groups).
  const ParallelLayout l{8, 1, 1, 4, 1, 2};
  const MeshShape m = mesh_shape(l);
  EXPECT_EQ(m.size("ep"), 2);
  EXPECT_EQ(m.size("eshard"), 2);
  EXPECT_EQ(m.size("ereplica"), 2);
  for (long long r = 0; r < 8; ++r) {
    EXPECT_EQ(m.coord(r, "ep"), r % 2) << r;
    EXPECT_EQ(m.coord(r, "eshard"), (r / 2) % 2) << r;
    EXPECT_EQ(m.coord(r, "ereplica"), r / 4) << r;
    // The holders of the same experts (edp): every rank of the same ep coordinate.
    EXPECT_EQ(m.group_size({"eshard", "ereplica"}), 4);
    EXPECT_EQ(m.group_color(r, {"eshard", "ereplica"}), m.group_color(r % 2, {"eshard", "ereplica"}));
    // An expert part's replicas are ZeRO's replica group.
    for (long long q = 0; q < 8; ++q)
      EXPECT_EQ(m.group_color(r, {"ereplica"}) == m.group_color(q, {"ereplica"}),
                m.group_color(r, {"replica"}) == m.group_color(q, {"replica"}))
          << r << " " << q;
  }
  // Ranks 0 and 2 split an expert's state (one ZeRO group, ep 0); 0 and 4 are replicas; 0 and 1
  // hold different experts.
  EXPECT_EQ(m.group_color(0, {"eshard"}), m.group_color(2, {"eshard"}));
  EXPECT_NE(m.group_color(0, {"eshard"}), m.group_color(4, {"eshard"}));
  EXPECT_NE(m.group_color(0, {"eshard"}), m.group_color(1, {"eshard"}));
  // Without hybrid sharding eshard is every holder.
  EXPECT_EQ(mesh_shape(ParallelLayout{8, 1, 1, 0, 1, 2}).size("eshard"), 4);
  EXPECT_EQ(mesh_shape(ParallelLayout{8, 1, 1, 0, 1, 2}).size("ereplica"), 1);
}

TEST(Mesh, UnknownNamesAreOneLine) {
  const MeshShape m = mesh_shape(ParallelLayout{2, 1, 1});
  EXPECT_EQ(m.unknown({"dp", "cp"}), "");
  EXPECT_EQ(m.unknown({"tp", "shard"}), "");
  EXPECT_EQ(m.unknown({"ep"}),
            "mesh: no dimension \"ep\" (the mesh has tp, cp, dp, pp; shard, replica)");
  EXPECT_EQ(m.unknown({"dp", "shard"}), "mesh: no view holds dp with shard (shard re-cuts cp x dp)");
  EXPECT_THROW(m.group_size({"ep"}), std::invalid_argument);
  EXPECT_THROW(m.size("expert"), std::invalid_argument);
  MeshShape bad({{"tp", 2}, {"dp", 3}});
  EXPECT_EQ(bad.add_view({"dp"}, {{"a", 2}, {"b", 2}}), "mesh: a=2 x b=2 = 4 does not cut dp=3 = 3");
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

TEST(Layout, ResolveLayoutFillsTheAutoEntry) {
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

TEST(Layout, ResolveLayoutErrorsNameTheNumbers) {
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

TEST(Mesh, WholeExpertsFoldEpOverTp) {
  // tp 2, dp 4, ep 4, whole experts: ep groups of 4 consecutive ranks of tp x dp (tp fastest).
  ParallelLayout l{4, 2, 1, 0, 1, 4};
  l.experts_whole = true;
  const MeshShape m = mesh_shape(l);
  EXPECT_EQ(m.size("ep"), 4);
  EXPECT_EQ(m.size("eshard"), 2);
  for (long long r = 0; r < 8; ++r) EXPECT_EQ(m.coord(r, "ep"), r % 4) << r;
  // Ranks 0 and 4 (tp 0, dp 0 and 2) hold the same experts; 0 and 1 (tp 0 and 1) do not.
  EXPECT_EQ(m.group_color(0, {"eshard", "ereplica"}), m.group_color(4, {"eshard", "ereplica"}));
  EXPECT_NE(m.group_color(0, {"eshard", "ereplica"}), m.group_color(1, {"eshard", "ereplica"}));
  // The refusals.
  l.ep = 2;
  l.tp = 4;
  l.dp = 2;
  EXPECT_EQ(check_expert_groups(l),
            "parallel.ep = 2 is not a multiple of parallel.tp = 4 (with parallel.expert_tp = 1 "
            "each ep group takes whole tp groups)");
  l = ParallelLayout{4, 2, 1, 4, 1, 4};
  l.experts_whole = true;
  EXPECT_NE(check_expert_groups(l).find("parallel.zero_group = 4 with parallel.expert_tp = 1"),
            std::string::npos);
}

TEST(Layout, ZeroGroupsHoldWholeEpGroups) {
  ParallelConfig c = parallel(8, 1, 1);
  c.ep = 4;
  c.zero_group = 2;
  ParallelLayout l;
  EXPECT_EQ(resolve_layout(c, 8, &l),
            "parallel.zero_group = 2 is not a multiple of parallel.ep = 4 (each ZeRO group must "
            "hold whole groups of the ep ranks that split the experts)");
  c.zero_group = 4;
  EXPECT_EQ(resolve_layout(c, 8, &l), "");
  EXPECT_EQ(l.zero_group, 4);
  EXPECT_EQ(l.ep, 4);
}

using Ranges = std::vector<std::pair<int, int>>;

TEST(Layout, StageLayerRanges) {
  EXPECT_EQ(stage_layer_ranges(5, 2, {}), (Ranges{{0, 3}, {3, 5}}));
  EXPECT_EQ(stage_layer_ranges(8, 3, {}), (Ranges{{0, 3}, {3, 6}, {6, 8}}));
  EXPECT_EQ(stage_layer_ranges(7, 4, {}), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  EXPECT_EQ(stage_layer_ranges(4, 1, {}), (Ranges{{0, 4}}));
  EXPECT_EQ(stage_layer_ranges(4, 4, {}), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(stage_layer_ranges(8, 3, {1, 3, 4}), (Ranges{{0, 1}, {1, 4}, {4, 8}}));
  EXPECT_EQ(stage_layer_ranges(5, 2, {4, 1}), (Ranges{{0, 4}, {4, 5}}));
}

TEST(Layout, CheckLayoutAcceptsGoodLayouts) {
  EXPECT_EQ(check_layout({2, 2, 2}, 4, 64, 4, {}, 16, 2), "");
  EXPECT_EQ(check_layout({1, 1, 1}, 1, 1, 1, {}, 1, 1), "");
  EXPECT_EQ(check_layout({3, 4, 3}, 12, 50304, 12, {6, 3, 3}, 36, 4), "");
  EXPECT_EQ(check_layout({1, 1, 4}, 4, 64, 4, {}, 8, 8), "");
}

TEST(Layout, CheckLayoutErrorsNameTheNumbers) {
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

TEST(Mesh, OneRankHasOneRankGroups) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  ASSERT_EQ(world_size, 1) << "the unit tests run on one rank";
  Mesh mesh(MPI_COMM_WORLD, mesh_shape(ParallelLayout{1, 1, 1}));
  EXPECT_EQ(mesh.rank(), 0);
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_EQ(mesh.world(), MPI_COMM_WORLD);
  for (const DimNames& g : {DimNames{"tp"}, DimNames{"dp", "cp"}, DimNames{"pp"},
                            DimNames{"shard"}, DimNames{"replica"}}) {
    MPI_Comm comm = mesh.group(g);
    ASSERT_NE(comm, MPI_COMM_NULL);
    EXPECT_EQ(comm_size(comm), 1);
  }
  EXPECT_EQ(mesh.embed(), MPI_COMM_NULL);
  EXPECT_THROW(mesh.group({"ep"}), std::invalid_argument);
  EXPECT_EQ(rank_grid(mesh.shape(), {stage_layer_ranges(4, 1, {})}, "wte, wpe", "wte copy, ln_f",
                      "wte, wpe, ln_f"),
            "rank 0: dp 0 tp 0 pp 0  layers 0-3 (+ wte, wpe, ln_f)");
}

TEST(Mesh, WrongWorldSizeIsRefused) {
  try {
    Mesh mesh(MPI_COMM_WORLD, mesh_shape(ParallelLayout{2, 1, 1}));
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()),
              "mesh: tp=1 x cp=1 x dp=2 x pp=1 = 2 ranks, but the job has 1");
  }
}

// rank_grid lists every world rank from the mesh's shape alone: the text of bigger grids.
TEST(Mesh, RankGridNamesEveryRank) {
  const MeshShape one = mesh_shape(ParallelLayout{1, 1, 1});
  EXPECT_EQ(rank_grid(one, {{{0, 1}}}, "a", "b", "wte, wpe, ln_f"),
            "rank 0: dp 0 tp 0 pp 0  layer 0 (+ wte, wpe, ln_f)");
  // Virtual stages: one range per chunk.
  EXPECT_EQ(rank_grid(one, {{{0, 2}, {4, 5}}}, "a", "b", "c"),
            "rank 0: dp 0 tp 0 pp 0  layers 0-1, 4 (+ c)");
  // cp shows where it is more than one rank.
  const std::string grid =
      rank_grid(mesh_shape(ParallelLayout{2, 2, 1, 0, 2}), {{{0, 4}}}, "a", "b", "e");
  EXPECT_NE(grid.find("rank 5: dp 1 cp 0 tp 1 pp 0  layers 0-3 (+ e)"), std::string::npos) << grid;
}

}  // namespace
}  // namespace tessera
