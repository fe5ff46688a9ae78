// The mesh's communicators (docs/architecture.md).
#include "parallel/mesh.hpp"

#include <stdexcept>
#include <vector>

#include "common/error.hpp"

namespace tessera {

namespace {

// The groups of a view: every non-empty set of its dimensions.
std::vector<DimNames> groups_of(const std::vector<MeshDim>& view) {
  std::vector<DimNames> out;
  for (unsigned set = 1; set < (1u << view.size()); ++set) {
    DimNames dims;
    for (size_t i = 0; i < view.size(); ++i)
      if ((set >> i) & 1u) dims.push_back(view[i].name);
    out.push_back(std::move(dims));
  }
  return out;
}

MPI_Comm split(MPI_Comm world, int color, int key) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(world, color, key, &comm);
  return comm;
}

}  // namespace

Mesh::Mesh(MPI_Comm world, MeshShape shape) : shape_(std::move(shape)), world_(world) {
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size_);
  const long long n = shape_.world_size();
  // Every rank sees the same sizes, so every rank throws, and none is left in a split.
  if (n != size_)
    throw UserError("mesh: " + shape_.describe() + " = " + std::to_string(n) +
                        (n == 1 ? " rank" : " ranks") + ", but the job has " +
                        std::to_string(size_),
                    kExitBadInput);
  // Sets of dimensions that name the same ranks in the same order share a name, and one split.
  for (const std::vector<MeshDim>& view : shape_.views())
    for (const DimNames& dims : groups_of(view)) {
      const std::string name = shape_.group_name(dims);
      if (groups_.count(name)) continue;
      if (shape_.group_size(dims) == 1) {
        groups_[name] = MPI_COMM_SELF;
        continue;
      }
      MPI_Comm comm = split(world, int(shape_.group_color(rank_, dims)),
                            shape_.group_rank(rank_, dims));
      MPI_Comm_set_name(comm, name.c_str());
      groups_[name] = comm;
    }
  // With one stage the embedding and the head share wte on the same rank: nothing to connect.
  const int pp = shape_.size("pp"), stage = coord("pp");
  if (pp > 1) {
    const bool ends = stage == 0 || stage == pp - 1;
    embed_ = split(world, ends ? int(shape_.group_color(rank_, {"pp"})) : MPI_UNDEFINED, stage);
    if (embed_ != MPI_COMM_NULL) MPI_Comm_set_name(embed_, "embed");
  }
}

Mesh::~Mesh() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI_Finalize already released every communicator
  for (auto& [name, comm] : groups_)
    if (comm != MPI_COMM_SELF) MPI_Comm_free(&comm);
  if (embed_ != MPI_COMM_NULL) MPI_Comm_free(&embed_);
}

MPI_Comm Mesh::group(const DimNames& dims) const {
  if (std::string e = shape_.unknown(dims); !e.empty()) throw std::invalid_argument(e);
  return groups_.at(shape_.group_name(dims));
}

}  // namespace tessera
