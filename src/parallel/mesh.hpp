#pragma once
// The world's communicators, every one of them taken from the mesh by name (docs/architecture.md):
// `mesh.group({"dp", "cp"})` is the communicator of the ranks that differ from this one only in
// dp and cp (the ranks holding the same parameters), ordered by their coordinates there. Built
// once, at construction, for every group of every view of the mesh (parallel/mesh_shape.hpp), so
// that asking for one is never a collective; the backends' communicators (Comm, NcclComm) are made
// from these. The one group that is not a set of whole dimensions, the tied embedding's pair of
// pipeline ends, is embed().
#include <mpi.h>

#include <map>
#include <string>
#include <string_view>

#include "parallel/mesh_shape.hpp"

namespace tessera {

class Mesh {
 public:
  // Collective over world: one MPI_Comm_split per group of more than one rank (named by
  // MeshShape::group_name, for the hang forensics), none for a group of one (MPI_COMM_SELF). A
  // world whose size is not the mesh's: UserError naming both ("mesh: tp=1 x cp=1 x dp=2 x pp=1
  // = 2 ranks, but the job has 1"), on every rank, before any split.
  Mesh(MPI_Comm world, MeshShape shape);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  MPI_Comm world() const { return world_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // A dimension's size, and this rank's coordinate along it (any view).
  int size(std::string_view dim) const { return shape_.size(dim); }
  int coord(std::string_view dim) const { return shape_.coord(rank_, dim); }

  // The group of the ranks that differ from this one only in `dims` (any order); a name the
  // mesh lacks, or names no view holds together: std::invalid_argument with MeshShape::unknown's
  // line.
  MPI_Comm group(const DimNames& dims) const;
  // The tied embedding's gradient: the first and the last stage of the same other coordinates,
  // first stage first; MPI_COMM_NULL on the middle stages and when pp == 1.
  MPI_Comm embed() const { return embed_; }

 private:
  MeshShape shape_;
  MPI_Comm world_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0;
  std::map<std::string, MPI_Comm> groups_;  // by group_name
  MPI_Comm embed_ = MPI_COMM_NULL;
};

}  // namespace tessera
