#pragma once
// What the checkpoint writer (checkpoint_write.cpp) and reader (checkpoint_read.cpp) share besides
// the API of io/checkpoint.hpp: the groups a canonical tensor is kept in, and how one rank's tile
// of it is selected and moved through MPI-IO. Internal to src/io: nothing else includes it.
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/hdf5_util.hpp"
#include "model/shard.hpp"

namespace tessera::ckpt {

// The datasets a checkpoint keeps canonical tensor c in, in order: /model/<name>, then
// /optim/<state>/<name> for each state of the rule that c has (StateSpec::holds). `state` is the
// index into the rule's state, -1 for the weights.
struct TensorDataset {
  std::string path;
  int state = -1;
  std::vector<size_t> shape;
};
std::vector<TensorDataset> tensor_datasets(const ParamTensor& c,
                                           const std::vector<StateSpec>& state);

// A whole (Rows / Cols) state is written, and its checksum counted, by the one writer holding
// its tensor's first element (canonical element 0): tile t, an owner, starts there.
bool holds_first_element(const LocalTensor* t);

// A dataset transfer property list for MPI-IO transfers of `mode`.
H5Handle transfer(H5FD_mpio_xfer_t mode);

// Selects this rank's blocks of a canonical tensor in the dataset's dataspace, or nothing when
// it holds none. A vector's dataspace has rank 1, so only row0/rows of each block are read.
void select_tile(hid_t space, const LocalTensor* t);

// The local buffer as a 1-D dataspace; one element, unselected, when this rank writes nothing.
H5Handle memory_space(const LocalTensor* t);

// Collective MPI-IO transfers for tensors of at least `collective_bytes` (two-phase aggregation
// pays for large data on a parallel file system); independent ones for the small tensors, where a
// collective round per tensor costs more than the data. Either way each rank moves only its tile.
H5FD_mpio_xfer_t transfer_mode(const ParamTensor& c, long collective_bytes);

// TrainState::fp8_amax as /train/fp8_amax_history under `train` (io/checkpoint_tables.cpp):
// created by every rank (collective metadata), its data written where write_data; read back
// (nothing where the checkpoint has none), its checksum and values checked, UserError naming
// `path` otherwise.
void write_fp8_history(hid_t train, const TrainState& state, bool write_data);
// n_layer, moe_layers and experts: the checkpoint's, whose rows the dataset must have
// (Fp8State::table_rows: per layer, the head's, per MoE layer its experts').
void read_fp8_history(hid_t train, const std::string& path, int n_layer, int moe_layers,
                      int experts, TrainState& state);
// TrainState::moe_bias as /train/moe_bias under `train` (io/checkpoint_tables.cpp), the same way:
// written by every rank's metadata and one rank's data, read back (nothing where the checkpoint
// has none) with its shape (the model's MoE layers by its experts), checksum and values checked.
void write_moe_bias(hid_t train, const TrainState& state, int experts, bool write_data);
void read_moe_bias(hid_t train, const std::string& path, const ModelShape& shape,
                   TrainState& state);

// The local tensor holding canonical tensor i on this rank, or null.
std::vector<const LocalTensor*> tiles_by_canonical(const LocalLayout& layout);

}  // namespace tessera::ckpt
