#pragma once
// The world as a mesh of named dimensions (docs/architecture.md): an ordered list of named sizes, fastest
// first, and the arithmetic of its ranks. Pure: no MPI, so that `tessera plan` counts a rank's
// groups with the same rules the trainer builds its communicators by (parallel/mesh.hpp).
//
// A world rank is the mixed-radix number of its coordinates, the first dimension fastest:
// with the order tp, cp, dp, pp
//   world_rank = ((pp * DP + dp) * CP + cp) * TP + tp
// A group is named by the dimensions its ranks differ in: group {"dp", "cp"} holds the ranks
// that share every other coordinate, ordered by their coordinates in the named dimensions
// (mixed radix again, in mesh order). A view re-cuts adjacent dimensions into others over the
// same ranks: ZeRO's shard groups (zero_group consecutive ranks of dp x cp) and their replicas
// are such a view of {cp, dp}; the expert axis will be another.
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct MeshDim {
  std::string name;
  int size = 1;
};

using DimNames = std::vector<std::string>;

class MeshShape {
 public:
  MeshShape() = default;
  // The base dimensions, fastest first. Names must be unique and sizes >= 1 (std::logic_error:
  // the mesh is the code's, not the user's; decks are checked before it is built).
  explicit MeshShape(std::vector<MeshDim> base);

  // Adds a view: the adjacent base dimensions `merged` (in mesh order) re-cut into `parts`
  // (fastest first), whose sizes multiply to theirs. Returns "" or one line naming the numbers:
  // "mesh: shard=3 x replica=1 = 3 does not cut cp=1 x dp=4 = 4".
  std::string add_view(const DimNames& merged, std::vector<MeshDim> parts);

  const std::vector<MeshDim>& dims() const { return views_.front(); }
  // Every view, the base first: each a full list of dimensions, fastest first.
  const std::vector<std::vector<MeshDim>>& views() const { return views_; }
  bool has(std::string_view dim) const;
  bool in_base(std::string_view dim) const { return place(dims(), dim) >= 0; }
  // The size of a dimension of any view (std::invalid_argument naming it when unknown).
  int size(std::string_view dim) const;
  long long world_size() const;

  // "" when the names are dimensions of one view (a view holds the base dimensions it did not
  // re-cut too: {"tp", "shard"} is a group), else one line naming them:
  //   mesh: no dimension "ep" (the mesh has tp, cp, dp, pp; shard, replica)
  //   mesh: no view holds dp with shard (shard re-cuts cp x dp)
  std::string unknown(const DimNames& dims) const;

  // The coordinate of world_rank along `dim`, and the rank at given coordinates of the base
  // dimensions (those not named at 0).
  int coord(long long world_rank, std::string_view dim) const;
  long long rank_at(const std::vector<MeshDim>& coords) const;

  // The group of the ranks that differ from world_rank only in `dims`: its size, world_rank's
  // place in it, and a number every member shares and no other rank does (MPI_Comm_split's
  // colour). std::invalid_argument when a name is unknown (unknown() says which).
  int group_size(const DimNames& dims) const;
  int group_rank(long long world_rank, const DimNames& dims) const;
  long long group_color(long long world_rank, const DimNames& dims) const;
  // The group's name: its dimensions slowest first, joined ("dpcp" for {"dp", "cp"}); a set
  // naming every part of a view's cut is named by the base dimensions they re-cut ({"shard",
  // "replica"} is "dpcp": the same ranks in the same order).
  std::string group_name(const DimNames& dims) const;

  // "tp=2 x cp=1 x dp=2 x pp=2" (the base, fastest first).
  std::string describe() const;

 private:
  // The view holding every name of dims (-1: none), and a dimension's place in a view.
  int view_of(const DimNames& dims) const;
  static int place(const std::vector<MeshDim>& view, std::string_view dim);
  std::vector<int> coords(const std::vector<MeshDim>& view, long long world_rank) const;

  std::vector<std::vector<MeshDim>> views_{{}};  // [0]: the base dimensions
  std::vector<DimNames> merged_;  // by view after the first: the base dimensions it re-cuts
};

}  // namespace tessera
