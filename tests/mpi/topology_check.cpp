// Multi-rank check of Topology, run by tests/integration/test_topology_mpi.sh:
//   mpiexec -n N topology_check DP TP PP N_LAYER      (DP, TP, PP: a number or auto)
// Every rank all-gathers the world ranks inside each of its communicators and compares them, in
// order, with the rank formula; embed must join exactly the first and the last stage of its
// (tp, dp). Each problem is printed as "problem on rank R: ..."; rank 0 then prints the rank grid
// and "checked dp=.. tp=.. pp=.. on N ranks, M problems".
// Exit 0: all good; 1: problems; 2: the layout was refused.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/topology.hpp"

namespace {

using tessera::CommName;
using tessera::ParallelLayout;
using tessera::RankCoord;

std::vector<std::string> problems;

void expect(bool ok, const std::string& what) {
  if (!ok) problems.push_back(what);
}

std::string text(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? " " : "") + std::to_string(v[i]);
  return out + "]";
}

// The world ranks of comm's members, in comm's rank order.
std::vector<int> members(MPI_Comm comm, int world_rank) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> ranks(n);
  MPI_Allgather(&world_rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, comm);
  return ranks;
}

// comm holds `expected` (world ranks) in that order, and this rank sits at `position`.
void check_comm(const tessera::Topology& topo, CommName name, const char* label,
                const std::vector<int>& expected, int position) {
  MPI_Comm comm = topo.comm(name);
  if (comm == MPI_COMM_NULL) {
    expect(false, std::string(label) + " is MPI_COMM_NULL");
    return;
  }
  std::vector<int> got = members(comm, topo.world_rank());
  expect(got == expected, std::string(label) + " holds " + text(got) + ", want " + text(expected));
  int rank = -1;
  MPI_Comm_rank(comm, &rank);
  expect(rank == position, std::string(label) + " rank " + std::to_string(rank) + ", want " +
                               std::to_string(position));
}

int parse(const char* arg) { return std::string(arg) == "auto" ? 0 : std::atoi(arg); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (argc != 5) {
    if (world_rank == 0) std::fprintf(stderr, "usage: topology_check DP TP PP N_LAYER\n");
    MPI_Finalize();
    return 2;
  }
  tessera::ParallelConfig cfg;
  cfg.dp = parse(argv[1]);
  cfg.tp = parse(argv[2]);
  cfg.pp = parse(argv[3]);
  int n_layer = std::atoi(argv[4]);

  ParallelLayout l;
  std::string error = tessera::resolve_layout(cfg, world_size, &l);
  if (error.empty()) error = tessera::check_layout(l, 4 * l.tp, 64 * l.tp, n_layer, {}, l.dp, 1);
  if (!error.empty()) {
    if (world_rank == 0) std::printf("%s\n", error.c_str());
    MPI_Finalize();
    return 2;
  }

  int failed = 0;
  {
    tessera::Topology topo(MPI_COMM_WORLD, l);
    const RankCoord c = topo.coord();
    const RankCoord want = tessera::coord_of(world_rank, l);
    expect(c.dp_rank == want.dp_rank && c.tp_rank == want.tp_rank && c.pp_rank == want.pp_rank,
           "coord differs from coord_of");
    expect(tessera::world_rank_of(c, l) == world_rank, "world_rank_of(coord) is not the rank");
    expect(topo.world_rank() == world_rank && topo.world_size() == world_size, "world rank/size");
    expect(topo.first_stage() == (c.pp_rank == 0), "first_stage");
    expect(topo.last_stage() == (c.pp_rank == l.pp - 1), "last_stage");

    // Each group varies one coordinate over its range, in order, and keeps the others.
    std::vector<int> tp_group, dp_group, pp_group;
    auto rank_at = [&](int d, int t, int p) { return tessera::world_rank_of({d, t, p}, l); };
    for (int t = 0; t < l.tp; t++) tp_group.push_back(rank_at(c.dp_rank, t, c.pp_rank));
    for (int d = 0; d < l.dp; d++) dp_group.push_back(rank_at(d, c.tp_rank, c.pp_rank));
    for (int p = 0; p < l.pp; p++) pp_group.push_back(rank_at(c.dp_rank, c.tp_rank, p));
    check_comm(topo, CommName::tp, "tp", tp_group, c.tp_rank);
    check_comm(topo, CommName::dp, "dp", dp_group, c.dp_rank);
    check_comm(topo, CommName::pp, "pp", pp_group, c.pp_rank);

    // Every rank that has an embed communicator gathers over it, wanted or not, so that a wrong
    // one shows up as a problem rather than a hang.
    bool ends = l.pp > 1 && (c.pp_rank == 0 || c.pp_rank == l.pp - 1);
    if (ends) {
      std::vector<int> embed_group = {pp_group.front(), pp_group.back()};
      check_comm(topo, CommName::embed, "embed", embed_group, c.pp_rank == 0 ? 0 : 1);
    } else if (topo.comm(CommName::embed) != MPI_COMM_NULL) {
      std::vector<int> got = members(topo.comm(CommName::embed), world_rank);
      expect(false, "embed holds " + text(got) + ", want MPI_COMM_NULL");
    }
    // World-wide: embed exists on exactly the 2 * dp * tp end-stage ranks (none when pp == 1).
    int has_embed = topo.comm(CommName::embed) != MPI_COMM_NULL ? 1 : 0, with_embed = 0;
    MPI_Allreduce(&has_embed, &with_embed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    expect(with_embed == (l.pp > 1 ? 2 * l.dp * l.tp : 0),
           std::to_string(with_embed) + " ranks have an embed communicator");

    for (const std::string& p : problems) {
      std::printf("problem on rank %d: %s\n", world_rank, p.c_str());
    }
    std::fflush(stdout);
    int mine = static_cast<int>(problems.size());
    MPI_Allreduce(&mine, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) {
      std::vector<std::vector<std::pair<int, int>>> stages;
      for (const auto& range : tessera::stage_layer_ranges(n_layer, l.pp, {}))
        stages.push_back({range});
      std::printf("%s\n",
                  topo.rank_grid(stages, "wte, wpe", "wte copy, ln_f", "wte, wpe, ln_f").c_str());
      std::printf("checked dp=%d tp=%d pp=%d on %d ranks, %d problems\n", l.dp, l.tp, l.pp,
                  world_size, failed);
    }
  }  // ~Topology frees the communicators before MPI_Finalize
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
