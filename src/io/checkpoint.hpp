#pragma once
// Parallel-HDF5 checkpoints (DESIGN §7): one file per checkpoint, canonical fp32 tensors, written
// collectively through the MPI-IO driver to step_NNNNNNNN.h5.tmp, renamed when complete, then
// `latest` updated. Every dataset carries a layout-independent checksum verified on read.
#include <mpi.h>

#include <cstdint>
#include <string>

#include "io/token_file.hpp"
#include "model/param_layout.hpp"

namespace tessera {

inline constexpr int kCheckpointFormatVersion = 1;

struct TrainState {
  int64_t step = 0;          // optimizer steps completed (also Adam's t)
  int64_t tokens_seen = 0;
  int64_t next_sample = 0;   // global sample index the next step starts at
  uint64_t seed = 0;
  double lr = 0;             // learning rate of the last step taken
};

// What a checkpoint holds besides the tensors.
struct CheckpointInfo {
  std::string path;
  std::string deck_yaml;
  ModelShape shape;
  TrainState state;
  TokenizerInfo tokenizer;
  std::string saved_layout;
};

// The flat buffers of one rank (the full model while there is one rank).
struct ModelBuffers {
  float* params = nullptr;
  float* exp_avg = nullptr;     // may be null on read: moments are then skipped
  float* exp_avg_sq = nullptr;
};

// Collective over comm. Returns the path of the completed checkpoint.
std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const ParamLayout& layout,
                             const ModelBuffers& buffers, const TrainState& state,
                             const std::string& deck_yaml, const TokenizerInfo& tokenizer);

// Reads attributes only (deck, shape, state). Throws UserError naming the file on anything wrong.
CheckpointInfo read_checkpoint_info(const std::string& path);

// Collective over comm. Checks the stored model shape against layout (UserError naming each
// differing value), reads the tensors and verifies their checksums.
CheckpointInfo read_checkpoint(MPI_Comm comm, const std::string& path, const ParamLayout& layout,
                               const ModelBuffers& buffers);

// The checkpoint `latest` names in dir, else the newest complete step_*.h5 there; "" if none.
// A path that is a file is returned as is.
std::string resolve_checkpoint(const std::string& dir_or_file);

// Order-free checksum of canonical elements [0, n) of a tensor, offset by `first_index`.
uint64_t tensor_checksum(const float* values, size_t n, uint64_t first_index);

}  // namespace tessera
