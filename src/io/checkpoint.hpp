#pragma once
// Parallel-HDF5 checkpoints (docs/checkpoints.md): one file per checkpoint, canonical fp32 tensors, written
// collectively through the MPI-IO driver to step_NNNNNNNN.h5.tmp, renamed when complete, then
// `latest` updated. Every dataset carries a layout-independent checksum verified on read.
//
// The optimizer's state is stored by its update rule's names (optim/rule.hpp): the /optim group's
// attribute `rule` names the rule ("adamw", "adafactor"; a checkpoint without it is AdamW's, as
// every checkpoint before the attribute), and each declared state tensor is a group
// /optim/<state>/<tensor>: AdamW's exp_avg and exp_avg_sq shaped like the parameters, as before;
// Adafactor's exp_avg, exp_avg_sq (vectors), exp_avg_sq_row [R] and exp_avg_sq_col [C].
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_file.hpp"
#include "model/shard.hpp"
#include "optim/rule.hpp"

namespace tessera {

inline constexpr int kCheckpointFormatVersion = 1;
// Scratch files of a checkpoint directory, there only while a write or the start-up probe runs:
// the disk space held for HDF5's metadata, and the probe.
inline constexpr const char* kRoomFile = ".tessera-room";
inline constexpr const char* kProbeFile = ".tessera-probe.h5";

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  int64_t tokens_seen = 0;
  int64_t next_sample = 0;   // global sample index the next step starts at
  uint64_t seed = 0;
  double lr = 0;             // learning rate of the last step taken
  // The data position is next_sample (with seed): the order is a function of the global sample
  // index alone. These say what it indexes, for the log and for a restart on changed data.
  std::string data_sources;  // "WEIGHT SPEC (FORMAT, N tokens)" per source
  std::string data_position; // the epoch of each source at next_sample
  // device.precision fp8 (model/fp8.hpp): every layer's amax histories, layout-free, as
  // /train/fp8_amax_history [rows, fp8_history]: per layer in order its 12 rows (the input,
  // weight and output gradient of its qkv, proj, fc and down GEMMs), then the LM head's 3, then
  // per MoE layer its routed experts' 2 (E + 2) (per GEMM, fc1 and fc2: the dispatched rows'
  // input and output gradient, each expert's weight); each row newest first, -1 where no step
  // has been. Empty without FP8.
  int fp8_history = 0;
  std::vector<float> fp8_amax;
  // model.moe.bias_rate (model/moe_layer.hpp): every MoE layer's selection bias, layout-free, as
  // /train/moe_bias [MoE layers, experts] in layer order. Empty without the bias.
  std::vector<float> moe_bias = {};
  // Steps the optimizer's state has taken (/optim attribute step: the rule's t): -1 = step, as
  // it is unless a restart started the state afresh (optim.reset_state).
  int64_t optim_step = -1;
};

// What a checkpoint holds besides the tensors.
struct CheckpointInfo {
  std::string path;
  std::string deck_yaml;
  ModelShape shape;
  TrainState state;
  TokenizerInfo tokenizer;
  std::string saved_layout;
  // False for a model-only checkpoint (tools/interop/import_weights.py): it has no /optim group, starts a
  // run through checkpoint.init_from, and cannot continue one.
  bool has_optimizer = true;
  // The update rule that wrote /optim ("adamw" where the file does not say) and the state tensors
  // it holds (its groups, in the rule's order).
  std::string optim_rule;
  std::vector<std::string> optim_state;
};

// One declared state tensor of the update rule and the host buffer holding it for the layout's
// tensors (state_host_layout: Elementwise at the layout's offsets, Rows / Cols one vector per
// tensor).
struct StateBuffer {
  StateSpec spec;
  float* data = nullptr;
};

// One rank's flat local buffers (its tile of the model, LocalLayout offsets) and the optimizer's
// state by the rule's names. Without state (rule "") a read skips /optim and a write makes none.
struct ModelBuffers {
  // AdamW's two moments beside the parameters (both null: no optimizer state).
  ModelBuffers(float* params = nullptr, float* exp_avg = nullptr, float* exp_avg_sq = nullptr);
  ModelBuffers(float* params, std::string rule, std::vector<StateBuffer> state);
  float* params = nullptr;
  std::string rule;
  std::vector<StateBuffer> state;
};

// Collective over comm (every rank of the job). Each canonical tensor is one dataset; the rank
// that owns a block of it (LocalTensor::owner, and `writer`: one rank of each data-parallel
// group) writes its hyperslabs, every other rank takes part with an empty selection. Returns the
// path of the completed checkpoint.
//
// `reserve`: rank 0 first reserves the file's expected size (checkpoint_bytes, fallocate; where
// the file system cannot, its free space is compared), so that a full disk or quota is found
// before a byte is written. A write that fails on any rank (a full disk, a quota, an I/O error)
// is agreed on by all ranks before the next collective call: the .tmp file is removed, `latest`
// keeps naming the previous checkpoint, and every rank throws the same UserError (exit 1),
// "checkpoint step N: disk full on DIR (...): kept step M (step_M.h5)".
std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const LocalLayout& layout,
                             bool writer, const ModelBuffers& buffers, const TrainState& state,
                             const std::string& deck_yaml, const TokenizerInfo& tokenizer,
                             const std::string& saved_layout, long collective_bytes = 1 << 20,
                             bool reserve = true);

// An upper bound on the bytes of a checkpoint of this model: its tensors and checksums, HDF5's
// metadata per dataset, the tokenizer model and text attributes of text_bytes.
// `state`: the rule's; without it, room for AdamW's two moments (the most any rule keeps).
uint64_t checkpoint_bytes(const LocalLayout& layout, const TokenizerInfo& tokenizer,
                          size_t text_bytes);
uint64_t checkpoint_bytes(const LocalLayout& layout, const std::vector<StateSpec>& state,
                          const TokenizerInfo& tokenizer, size_t text_bytes);

// The file name MPI-IO (ROMIO) is given for `path`: ROMIO reads text before a ':' as a file-system
// prefix ("runs/10:00/x.h5" would be file system "runs/10"), so a path holding one gets the
// generic "ufs:" prefix, which ROMIO strips.
std::string mpiio_name(const std::string& path);

// Creates and removes a parallel HDF5 file in dir as write_checkpoint does (MPI-IO, every rank),
// so that a directory that cannot take a checkpoint is found before training. Collective;
// returns "" or the problem, the same on every rank.
std::string probe_checkpoint_dir(MPI_Comm comm, const std::string& dir);

// Reads attributes only (deck, shape, state). Throws UserError naming the file on anything wrong.
CheckpointInfo read_checkpoint_info(const std::string& path);

// UserError naming each value of the stored model shape that differs from layout's.
void check_checkpoint_shape(const CheckpointInfo& info, const LocalLayout& layout);
// A run continues only from a checkpoint with optimizer state (imported weights have none) that
// the deck's rule can read: written by `rule`, holding every tensor of `state`. "" when it can,
// else the one line saying why (the rule and the state names on both sides, and what to set);
// require_ throws it (UserError, exit 2). Without `state`: only that there is optimizer state.
std::string optimizer_state_problem(const CheckpointInfo& info, const std::string& rule,
                                    const std::vector<StateSpec>& state);
void require_optimizer_state(const CheckpointInfo& info, const std::string& rule = "",
                             const std::vector<StateSpec>& state = {});

// Collective over comm. Checks the stored model shape against layout (UserError naming each
// differing value), reads every rank's tile, whatever layout wrote the file, and verifies the
// checksums (over the blocks of the owning `writer` ranks, which together cover each tensor once).
// Asking for optimizer state a checkpoint does not hold (none, another rule's, a tensor missing)
// is a UserError (require_optimizer_state). A Rows / Cols state is read whole by every rank
// holding a piece of its tensor, and written and counted by the one that holds its first
// element among the writers.
CheckpointInfo read_checkpoint(MPI_Comm comm, const std::string& path, const LocalLayout& layout,
                               bool writer, const ModelBuffers& buffers,
                               long collective_bytes = 1 << 20);

// The checkpoint `latest` names in dir, else the newest complete step_*.h5 there; "" if none or
// if nothing is at the path. Anything else at the path (a file, a FIFO, a link loop) is returned
// as is, for read_checkpoint_info to read or to refuse by name.
std::string resolve_checkpoint(const std::string& dir_or_file);

// The restart state and model shape as one canonical text, and its hash: stored as the root
// attribute `state_checksum`, so that an attribute changed after the write is found on read.
std::string state_text(const TrainState& state, const ModelShape& shape);
uint64_t state_checksum(const TrainState& state, const ModelShape& shape);

// The first element of values[0, n) that is not finite (or, with non_negative, below zero), as
// "NAME holds VALUE at element I"; "" when there is none.
std::string first_bad_value(const std::string& name, const float* values, size_t n,
                            bool non_negative);

// checkpoint.keep: removes the complete step_*.h5 files of dir older than its `keep` newest
// (keep >= 1; the newest is never removed, and neither are .tmp files, which a write still
// owns). Returns the names removed, or throws UserError (exit 1) naming a removal that failed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int keep);

// `tessera ckpt verify`: reads every tensor of the checkpoint at path through read_checkpoint on
// one rank (the same checksum walk and value checks as a restart), throwing the first problem.
CheckpointInfo verify_checkpoint(const std::string& path);

// checkpoint.restart: auto on one rank: the newest checkpoint of dir that verify_checkpoint
// accepts (`latest`'s first, then the complete step_*.h5 files newest first), "" if none. Each one
// refused on the way is renamed to NAME.damaged (so that neither a later restart nor
// checkpoint.keep's pruning takes it for a checkpoint) and named in a line of *skipped; `latest`
// then names the one returned (or is removed when there is none).
std::string newest_sound_checkpoint(const std::string& dir, std::vector<std::string>* skipped);

// Order-free checksum of a tensor's elements: the sum over elements of a hash of (canonical
// index, value bits), so the parts held by different ranks add up to the whole.
uint64_t element_hash(uint64_t canonical_index, float value);
uint64_t tile_checksum(const LocalLayout& layout, const LocalTensor& tensor, const float* values);

}  // namespace tessera
