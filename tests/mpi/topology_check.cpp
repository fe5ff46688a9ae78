// Multi-rank check of the rank mesh, run by tests/integration/test_topology_mpi.sh:
//   mpiexec -n N topology_check DP TP PP N_LAYER [CP ZERO_GROUP]   (DP, TP, PP: a number or auto)
// Every rank all-gathers the world ranks inside each group the Mesh built (every set of
// dimensions of the base, and ZeRO's shard and replica views) and compares them, in order, with
// the ranks that share every other coordinate; tp, dp and pp also with the rank formula written
// out; embed must join exactly the first and the last stage. Each problem is printed as
// "problem on rank R: ..."; rank 0 then prints the rank grid and "checked dp=.. tp=.. pp=.. on N
// ranks, G groups, M problems". Exit 0: all good; 1: problems; 2: the layout was refused.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/layout.hpp"
#include "parallel/mesh.hpp"

namespace {

using tessera::DimNames;
using tessera::Mesh;
using tessera::MeshShape;
using tessera::ParallelLayout;

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

// comm holds `expected` (world ranks) in that order.
void check_comm(MPI_Comm comm, const std::string& label, const std::vector<int>& expected,
                int world_rank) {
  if (comm == MPI_COMM_NULL) {
    expect(false, label + " is MPI_COMM_NULL");
    return;
  }
  const std::vector<int> got = members(comm, world_rank);
  expect(got == expected, label + " holds " + text(got) + ", want " + text(expected));
  int rank = -1;
  MPI_Comm_rank(comm, &rank);
  const long at = std::find(expected.begin(), expected.end(), world_rank) - expected.begin();
  expect(rank == at, label + " rank " + std::to_string(rank) + ", want " + std::to_string(at));
}

// The ranks sharing every coordinate of view `v` outside `dims` with world_rank, in world order.
std::vector<int> brute_force(const MeshShape& m, size_t v, const DimNames& dims, int world_rank) {
  std::vector<int> out;
  for (int q = 0; q < int(m.world_size()); ++q) {
    bool same = true;
    for (const tessera::MeshDim& d : m.views()[v])
      if (std::find(dims.begin(), dims.end(), d.name) == dims.end() &&
          m.coord(q, d.name) != m.coord(world_rank, d.name))
        same = false;
    if (same) out.push_back(q);
  }
  return out;
}

int parse(const char* arg) { return std::string(arg) == "auto" ? 0 : std::atoi(arg); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (argc != 5 && argc != 7) {
    if (world_rank == 0)
      std::fprintf(stderr, "usage: topology_check DP TP PP N_LAYER [CP ZERO_GROUP]\n");
    MPI_Finalize();
    return 2;
  }
  tessera::ParallelConfig cfg;
  cfg.dp = parse(argv[1]);
  cfg.tp = parse(argv[2]);
  cfg.pp = parse(argv[3]);
  const int n_layer = std::atoi(argv[4]);
  if (argc == 7) cfg.cp = std::atoi(argv[5]), cfg.zero_group = std::atoi(argv[6]);

  ParallelLayout l;
  std::string error = tessera::resolve_layout(cfg, world_size, &l);
  if (error.empty()) error = tessera::check_layout(l, 4 * l.tp, 64 * l.tp, n_layer, {}, l.dp, 1);
  if (!error.empty()) {
    if (world_rank == 0) std::printf("%s\n", error.c_str());
    MPI_Finalize();
    return 2;
  }

  int failed = 0, groups = 0;
  {
    const Mesh mesh(MPI_COMM_WORLD, tessera::mesh_shape(l));
    const MeshShape& m = mesh.shape();
    expect(mesh.rank() == world_rank && mesh.size() == world_size, "world rank/size");
    const int dp = mesh.coord("dp"), tp = mesh.coord("tp"), pp = mesh.coord("pp"),
              cp = mesh.coord("cp");
    // The formula of DESIGN §3, written out.
    expect(world_rank == ((pp * l.dp + dp) * l.cp + cp) * l.tp + tp, "coordinates vs formula");

    // tp, dp, pp against the formula: one coordinate varies over its range, in order.
    auto rank_at = [&](int d, int t, int p) { return ((p * l.dp + d) * l.cp + cp) * l.tp + t; };
    std::vector<int> tp_group, dp_group, pp_group;
    for (int t = 0; t < l.tp; t++) tp_group.push_back(rank_at(dp, t, pp));
    for (int d = 0; d < l.dp; d++) dp_group.push_back(rank_at(d, tp, pp));
    for (int p = 0; p < l.pp; p++) pp_group.push_back(rank_at(dp, tp, p));
    check_comm(mesh.group({"tp"}), "tp (formula)", tp_group, world_rank);
    check_comm(mesh.group({"dp"}), "dp (formula)", dp_group, world_rank);
    check_comm(mesh.group({"pp"}), "pp (formula)", pp_group, world_rank);

    // Every set of dimensions of every view, against brute force.
    for (size_t v = 0; v < m.views().size(); ++v) {
      const auto& view = m.views()[v];
      for (unsigned set = 1; set < (1u << view.size()); ++set) {
        DimNames dims;
        for (size_t i = 0; i < view.size(); ++i)
          if ((set >> i) & 1u) dims.push_back(view[i].name);
        check_comm(mesh.group(dims), m.group_name(dims), brute_force(m, v, dims, world_rank),
                   world_rank);
        ++groups;
      }
    }

    // Every rank that has an embed communicator gathers over it, wanted or not, so that a wrong
    // one shows up as a problem rather than a hang.
    const bool ends = l.pp > 1 && (pp == 0 || pp == l.pp - 1);
    if (ends) {
      check_comm(mesh.embed(), "embed", {pp_group.front(), pp_group.back()}, world_rank);
    } else if (mesh.embed() != MPI_COMM_NULL) {
      expect(false, "embed holds " + text(members(mesh.embed(), world_rank)) +
                        ", want MPI_COMM_NULL");
    }
    // World-wide: embed exists on exactly the end-stage ranks (none when pp == 1).
    int has_embed = mesh.embed() != MPI_COMM_NULL ? 1 : 0, with_embed = 0;
    MPI_Allreduce(&has_embed, &with_embed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    expect(with_embed == (l.pp > 1 ? 2 * l.dp * l.tp * l.cp : 0),
           std::to_string(with_embed) + " ranks have an embed communicator");

    for (const std::string& p : problems) std::printf("problem on rank %d: %s\n", world_rank, p.c_str());
    std::fflush(stdout);
    int mine = static_cast<int>(problems.size());
    MPI_Allreduce(&mine, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) {
      std::vector<std::vector<std::pair<int, int>>> stages;
      for (const auto& range : tessera::stage_layer_ranges(n_layer, l.pp, {}))
        stages.push_back({range});
      std::printf("%s\n", tessera::rank_grid(m, stages, "wte, wpe", "wte copy, ln_f",
                                             "wte, wpe, ln_f").c_str());
      std::printf("checked dp=%d tp=%d pp=%d%s on %d ranks, %d groups, %d problems\n", l.dp, l.tp,
                  l.pp, l.cp > 1 ? (" cp=" + std::to_string(l.cp)).c_str() : "", world_size,
                  groups, failed);
    }
  }  // ~Mesh frees the communicators before MPI_Finalize
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
