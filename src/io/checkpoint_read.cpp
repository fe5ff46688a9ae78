// Reading checkpoints: the attributes, first checked in a child process (io/contained.hpp), the
// stored shape against the deck's, every rank's tile read whatever layout wrote the file, the
// checksums and values verified; `tessera ckpt verify`, and which file a restart picks.
#include "io/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/files.hpp"
#include "common/limits.hpp"
#include "io/checkpoint_format.hpp"
#include "io/contained.hpp"
#include "io/hdf5_util.hpp"
#include "io/tokenizer.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

H5Handle open_parallel_file(MPI_Comm comm, const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Handle file(H5Fopen(mpiio_name(path).c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid())
    throw UserError("cannot open checkpoint " + path + ": " + h5_error_reason(), kExitIO);
  return file;
}

// Opens dataset /path of a checkpoint: there, of `shape`, and contiguous as tessera writes it.
// Another layout is a damaged or foreign file, and a damaged chunk index can make libhdf5
// allocate and fill gigabytes (found by tests/fuzz).
H5Handle open_tensor(hid_t file, const std::string& ckpt, const std::string& path,
                     const std::vector<size_t>& shape) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(ckpt + ": missing dataset /" + path);
  H5Handle dset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid())
    throw UserError(ckpt + ": /" + path + " cannot be opened: " + h5_error_reason());
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (std::vector<size_t>(dims.begin(), dims.end()) != shape)
    throw UserError(ckpt + ": /" + path + " has a different shape from the deck's model");
  H5Handle plist(H5Dget_create_plist(dset.get()), H5Pclose);
  if (H5Pget_layout(plist.get()) != H5D_CONTIGUOUS)
    throw UserError(ckpt + ": /" + path + " is not stored contiguously as tessera writes it "
                    "(a damaged file, or not a tessera checkpoint)");
  // Its bytes where the file has them: a damaged address or size sends libhdf5 reading (or
  // seeking) far past the end, slowly (found by tests/fuzz).
  H5Handle type(H5Dget_type(dset.get()), H5Tclose);
  uint64_t want = sizeof(float);
  for (size_t d : shape) want *= d;
  const haddr_t at = H5Dget_offset(dset.get());
  const uint64_t stored = H5Dget_storage_size(dset.get());
  std::error_code ec;
  const uint64_t file_bytes = fs::file_size(ckpt, ec);
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != sizeof(float) ||
      stored != want || at == HADDR_UNDEF || ec || uint64_t(at) + stored > file_bytes)
    throw UserError(ckpt + ": /" + path + " is not " + std::to_string(want) + " bytes of float32 " +
                    "inside the file's " + std::to_string(file_bytes) + " bytes (a damaged file)");
  return dset;
}

// Reads this rank's tile of canonical tensor c (every rank that holds one, owner or not).
// Returns this rank's part of the checksum when it is `counted`, else 0.
uint64_t read_tensor(hid_t file, const std::string& ckpt, const std::string& path,
                     const LocalLayout& layout, const ParamTensor& c, const LocalTensor* t,
                     bool counted, float* local, long collective_bytes, bool non_negative,
                     std::string* bad) {
  H5Handle dset = open_tensor(file, ckpt, path, c.shape);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  ckpt::select_tile(space.get(), t);
  H5Handle mem = ckpt::memory_space(t);
  const H5FD_mpio_xfer_t mode = ckpt::transfer_mode(c, collective_bytes);
  if ((t || mode == H5FD_MPIO_COLLECTIVE) &&
      H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), ckpt::transfer(mode).get(),
              local) < 0)
    throw UserError(ckpt + ": read of /" + path + " failed", kExitIO);
  // A value no training state can hold: found after the checksums (a damaged file is an I/O
  // error), reported as bad input.
  if (t && bad->empty())
    *bad = first_bad_value("/" + path, local, t->numel, non_negative);
  return t && counted ? tile_checksum(layout, *t, local) : 0;
}

// Reads a whole (Rows / Cols) state of `shape` into `local` where this rank holds a piece of its
// tensor (an independent read); returns this rank's part of the checksum when it is `counted`
// (its one writer), else 0.
uint64_t read_whole(hid_t file, const std::string& ckpt, const std::string& path,
                    const std::vector<size_t>& shape, bool holds, bool counted, float* local,
                    bool non_negative, std::string* bad) {
  H5Handle dset = open_tensor(file, ckpt, path, shape);
  if (!holds) return 0;
  if (H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
              ckpt::transfer(H5FD_MPIO_INDEPENDENT).get(), local) < 0)
    throw UserError(ckpt + ": read of /" + path + " failed", kExitIO);
  size_t n = 1;
  for (size_t d : shape) n *= d;
  if (bad->empty()) *bad = first_bad_value("/" + path, local, n, non_negative);
  uint64_t sum = 0;
  for (size_t i = 0; counted && i < n; ++i) sum += element_hash(i, local[i]);
  return sum;
}

void verify_checksums(hid_t file, const std::string& ckpt, const std::vector<std::string>& paths,
                      const std::vector<uint64_t>& sums) {
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string path = "checksum/" + paths[i];
    uint64_t stored = 0;
    H5Handle cset(H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0
                      ? H5Dopen2(file, path.c_str(), H5P_DEFAULT)
                      : H5I_INVALID_HID,
                  H5Dclose);
    if (!cset.valid() || H5Dread(cset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL,
                                 ckpt::transfer(H5FD_MPIO_INDEPENDENT).get(), &stored) < 0)
      throw UserError(ckpt + ": missing checksum for /" + paths[i]);
    if (stored != sums[i])
      throw UserError(ckpt + ": checksum mismatch in /" + paths[i] + " (file corrupt?)", kExitIO);
  }
}

int64_t require_int(hid_t obj, const std::string& file, const std::string& name) {
  auto v = h5_read_int_attr(obj, name);
  if (!v) throw UserError(file + ": missing attribute " + name + " (not a tessera checkpoint?)");
  return *v;
}

// An integer attribute within [lo, hi]: a damaged or crafted file must not have its sizes narrowed
// into plausible ones.
int64_t require_int(hid_t obj, const std::string& file, const std::string& name, int64_t lo,
                    int64_t hi) {
  const int64_t v = require_int(obj, file, name);
  if (v < lo || v > hi)
    throw UserError(file + ": attribute " + name + " = " + std::to_string(v) + " is outside " +
                    std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

CheckpointInfo read_info_here(const std::string& path) {
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw UserError(path + ": not an HDF5 file (a tessera checkpoint is step_NNNNNNNN.h5)");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid())
    throw UserError("cannot open checkpoint " + path + ": " + h5_error_reason(), kExitIO);
  const hid_t root = file.get();
  if (h5_read_string_attr(root, "format").value_or("") != "tessera-checkpoint")
    throw UserError(path + ": not a tessera checkpoint (no format=tessera-checkpoint attribute)");
  const int64_t version = require_int(root, path, "format_version");
  if (version != kCheckpointFormatVersion)
    throw UserError(path + ": checkpoint format_version " + std::to_string(version) +
                    ", this tessera reads " + std::to_string(kCheckpointFormatVersion));
  CheckpointInfo info;
  info.path = path;
  info.deck_yaml = h5_read_string_attr(root, "deck").value_or("");
  info.saved_layout = h5_read_string_attr(root, "saved_layout").value_or("");
  info.state.step = require_int(root, path, "step", 0, INT_MAX);
  info.state.tokens_seen = require_int(root, path, "tokens_seen", 0, INT64_MAX);
  for (const char* group : {"model", "train", "tokenizer"})
    if (H5Lexists(root, group, H5P_DEFAULT) <= 0)
      throw UserError(path + ": missing group /" + group);
  info.has_optimizer = H5Lexists(root, "optim", H5P_DEFAULT) > 0;
  if (info.has_optimizer) {
    // The rule that wrote the state (AdamW where the file does not say: every checkpoint before
    // the attribute) and which of its tensors are there.
    H5Handle optim(H5Gopen2(root, "optim", H5P_DEFAULT), H5Gclose);
    info.optim_rule = h5_read_string_attr(optim.get(), "rule").value_or("adamw");
    if (!known_rule(info.optim_rule))
      throw UserError(path + ": its optimizer state was written by a rule this tessera does not "
                      "know (/optim attribute rule '" + info.optim_rule + "'; it knows adamw "
                      "and adafactor)");
    for (const StateSpec& spec : rule_state_names(info.optim_rule))
      if (H5Lexists(optim.get(), spec.name.c_str(), H5P_DEFAULT) > 0)
        info.optim_state.push_back(spec.name);
    // What every state of the rule has (Adafactor's first moment is optional: beta1 = 0).
    OptimHyper bare;
    rule_named(info.optim_rule, &bare.rule);
    bare.adafactor.beta1 = 0;
    for (const StateSpec& spec : rule_state(bare))
      if (H5Lexists(optim.get(), spec.name.c_str(), H5P_DEFAULT) <= 0)
        throw UserError(path + ": missing group /optim/" + spec.name + " (" + info.optim_rule +
                        " keeps it)");
    info.state.optim_step = h5_read_int_attr(optim.get(), "step")
                                ? require_int(optim.get(), path, "step", 0, info.state.step)
                                : info.state.step;
  }
  H5Handle model(H5Gopen2(root, "model", H5P_DEFAULT), H5Gclose);
  info.shape.n_layer = int(require_int(model.get(), path, "n_layer", 1, limits::kLayers));
  info.shape.n_head = int(require_int(model.get(), path, "n_head", 1, limits::kEmbd));
  info.shape.n_embd = int(require_int(model.get(), path, "n_embd", 1, limits::kEmbd));
  info.shape.block_size = int(require_int(model.get(), path, "block_size", 1, limits::kBlock));
  info.shape.vocab_size = int(require_int(model.get(), path, "vocab_size", 1, limits::kVocab));
  info.shape.padded_vocab =
      int(require_int(model.get(), path, "padded_vocab", info.shape.vocab_size,
                      int64_t(info.shape.vocab_size) + limits::kVocabMultiple));
  if (info.shape.n_embd % info.shape.n_head != 0)
    throw UserError(path + ": n_embd " + std::to_string(info.shape.n_embd) +
                    " is not a multiple of n_head " + std::to_string(info.shape.n_head));
  // Checkpoints from before the LLaMA family are GPT-2's.
  const std::string arch = h5_read_string_attr(model.get(), "arch").value_or("gpt2");
  const Family* family = family_named(arch);
  if (family == nullptr)
    throw UserError(path + ": /model attribute arch '" + arch + "' is none of tessera's model " +
                    "families (" + family_names() + ")");
  info.shape.arch = family->arch;
  info.shape.n_kv_head = h5_read_int_attr(model.get(), "n_kv_head")
                             ? int(require_int(model.get(), path, "n_kv_head", 1, info.shape.n_head))
                             : info.shape.n_head;
  if (info.shape.n_head % info.shape.n_kv_head != 0)
    throw UserError(path + ": n_kv_head " + std::to_string(info.shape.n_kv_head) +
                    " does not divide n_head " + std::to_string(info.shape.n_head));
  info.shape.ffn_hidden = h5_read_int_attr(model.get(), "ffn_hidden")
                              ? int(require_int(model.get(), path, "ffn_hidden", 1, limits::kFfn))
                              : 4 * info.shape.n_embd;
  info.shape.tied = h5_read_int_attr(model.get(), "tie_embeddings").value_or(1) != 0;
  info.shape.norm_eps = h5_read_double_attr(model.get(), "norm_eps").value_or(1e-5);
  info.shape.rope_theta = h5_read_double_attr(model.get(), "rope_theta").value_or(10000.0);
  info.shape.qk_norm = h5_read_int_attr(model.get(), "qk_norm").value_or(0) != 0;
  if (info.shape.qk_norm && info.shape.arch != Arch::Llama)
    throw UserError(path + ": /model attribute qk_norm 1 on a " + arch +
                    " model (q/k norms are llama's)");
  if (h5_read_int_attr(model.get(), "moe_experts")) {
    MoeShape& m = info.shape.moe;
    m.experts = int(require_int(model.get(), path, "moe_experts", 1, limits::kExperts));
    m.top_k = int(require_int(model.get(), path, "moe_top_k", 1, m.experts));
    m.ffn = int(require_int(model.get(), path, "moe_ffn", 1, limits::kFfn));
    m.every = int(require_int(model.get(), path, "moe_every", 1, limits::kLayers));
    m.first_dense = int(require_int(model.get(), path, "moe_first_dense", 0, limits::kLayers));
    if (h5_has_attr(model.get(), "moe_shared_experts"))
      m.shared = int(require_int(model.get(), path, "moe_shared_experts", 0, limits::kExperts));
  }
  H5Handle train(H5Gopen2(root, "train", H5P_DEFAULT), H5Gclose);
  info.state.next_sample = require_int(train.get(), path, "next_sample", 0, INT64_MAX);
  info.state.seed = uint64_t(require_int(train.get(), path, "seed"));
  info.state.lr = h5_read_double_attr(train.get(), "lr").value_or(0.0);
  info.state.data_sources = h5_read_string_attr(train.get(), "data_sources").value_or("");
  info.state.data_position = h5_read_string_attr(train.get(), "data_position").value_or("");
  int moe_layers = 0;
  for (int l = 0; l < info.shape.n_layer; ++l) moe_layers += info.shape.moe.layer(l) ? 1 : 0;
  ckpt::read_fp8_history(train.get(), path, info.shape.n_layer, moe_layers,
                         info.shape.moe.experts, info.state);
  ckpt::read_moe_bias(train.get(), path, info.shape, info.state);
  if (!std::isfinite(info.state.lr) || info.state.lr < 0)
    throw UserError(path + ": /train attribute lr " + std::to_string(info.state.lr) +
                    " is not a learning rate (finite, >= 0)");
  // The restart state is covered by a checksum of its own (every run checkpoint has one; imported
  // weights, which restart nothing, need none).
  const auto stored = h5_read_int_attr(root, "state_checksum");
  if (!stored && info.has_optimizer)
    throw UserError(path + ": missing attribute state_checksum (the restart state is unchecked)");
  if (stored && uint64_t(*stored) != state_checksum(info.state, info.shape))
    throw UserError(path + ": attribute state_checksum does not match the restart attributes "
                    "(step, tokens_seen, /train next_sample, seed, lr, data_sources, "
                    "data_position, the /model shape): one was changed after the write");
  H5Handle tok(H5Gopen2(root, "tokenizer", H5P_DEFAULT), H5Gclose);
  info.tokenizer.type = h5_read_string_attr(tok.get(), "type").value_or("byte");
  info.tokenizer.vocab_size = require_int(tok.get(), path, "vocab_size");
  info.tokenizer.eot = require_int(tok.get(), path, "eot");
  info.tokenizer.model = read_tokenizer_model(tok.get(), path, "model");
  check_tokenizer(info.tokenizer, path);
  return info;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  hdf5_quiet();
  require_regular_file(path, "checkpoint");
  // The metadata first in a child process (io/contained.hpp), where libhdf5 crashing on a damaged
  // file is one more error: the attributes, and every tensor's dataset opened and checked as a
  // read will open it.
  run_contained("checkpoint " + path, [&] {
    const CheckpointInfo info = read_info_here(path);
    H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    const LocalLayout whole = make_local_layout(info.shape, 1, 0, 0, info.shape.n_layer, true, true);
    std::vector<StateSpec> present;
    for (const StateSpec& spec : rule_state_names(info.optim_rule))
      if (std::find(info.optim_state.begin(), info.optim_state.end(), spec.name) !=
          info.optim_state.end())
        present.push_back(spec);
    for (const ParamTensor& c : whole.canonical.tensors)
      for (const ckpt::TensorDataset& d : ckpt::tensor_datasets(c, present))
        open_tensor(file.get(), path, d.path, d.shape);
  });
  return read_info_here(path);
}

void check_checkpoint_shape(const CheckpointInfo& info, const LocalLayout& layout) {
  const ModelShape &a = info.shape, &b = layout.canonical.shape;
  std::string diff;
  auto check = [&](const char* key, const auto& stored, const auto& wanted) {
    if (stored == wanted) return;
    std::ostringstream text;
    text << (diff.empty() ? "" : ", ") << key << " " << stored << " in the checkpoint, " << wanted
         << " in the deck";
    diff += text.str();
  };
  auto boolean = [](bool x) { return std::string(x ? "true" : "false"); };
  check("model.n_layer", a.n_layer, b.n_layer);
  check("model.n_head", a.n_head, b.n_head);
  check("model.n_embd", a.n_embd, b.n_embd);
  check("model.block_size", a.block_size, b.block_size);
  check("vocab_size", a.vocab_size, b.vocab_size);
  check("padded vocab", a.padded_vocab, b.padded_vocab);
  check("model.n_kv_head", a.n_kv_head, b.n_kv_head);
  check("model.ffn_hidden", a.ffn_hidden, b.ffn_hidden);
  check("model.tie_embeddings", boolean(a.tied), boolean(b.tied));
  check("model.arch", std::string(arch_name(a.arch)), std::string(arch_name(b.arch)));
  check("model.norm_eps", a.norm_eps, b.norm_eps);
  check("model.rope_theta", a.rope_theta, b.rope_theta);
  check("model.qk_norm", boolean(a.qk_norm), boolean(b.qk_norm));
  check("model.moe.experts", a.moe.experts, b.moe.experts);
  if (a.moe.experts > 0 && b.moe.experts > 0) {
    check("model.moe.top_k", a.moe.top_k, b.moe.top_k);
    check("model.moe.ffn", a.moe.ffn, b.moe.ffn);
    check("model.moe.every", a.moe.every, b.moe.every);
    check("model.moe.first_dense", a.moe.first_dense, b.moe.first_dense);
    check("model.moe.shared_experts", a.moe.shared, b.moe.shared);
  }
  if (!diff.empty()) throw UserError(info.path + ": model shape differs from the deck: " + diff);
}

std::string optimizer_state_problem(const CheckpointInfo& info, const std::string& rule,
                                    const std::vector<StateSpec>& state) {
  if (!info.has_optimizer)
    return info.path + ": holds no optimizer state (no /optim: imported weights?), so no run "
           "continues from it; start a new one with checkpoint.init_from";
  std::string missing, want, have;
  for (const StateSpec& spec : state) {
    want += (want.empty() ? "" : ", ") + spec.name;
    if (std::find(info.optim_state.begin(), info.optim_state.end(), spec.name) ==
        info.optim_state.end())
      missing += (missing.empty() ? "" : ", ") + spec.name;
  }
  for (const std::string& name : info.optim_state) have += (have.empty() ? "" : ", ") + name;
  if (rule.empty() || (info.optim_rule == rule && missing.empty())) return "";
  const std::string what =
      info.optim_rule != rule
          ? "its optimizer state was written by optim.name = " + info.optim_rule + " (" + have +
                "), the deck's optim.name = " + rule + " reads " + want
          : "the deck's optim.name = " + rule + " needs optimizer state " + want +
                ", the checkpoint holds " + have + " (no " + missing + ")";
  return info.path + ": " + what + ": set optim.name: " + info.optim_rule +
         " and its settings to continue it, or optim.reset_state: true to start " + rule +
         "'s state afresh from these weights";
}

void require_optimizer_state(const CheckpointInfo& info, const std::string& rule,
                             const std::vector<StateSpec>& state) {
  if (std::string why = optimizer_state_problem(info, rule, state); !why.empty())
    throw UserError(why);
}

CheckpointInfo read_checkpoint(MPI_Comm comm, const std::string& path, const LocalLayout& layout,
                               bool writer, const ModelBuffers& buffers, long collective_bytes) {
  CheckpointInfo info = read_checkpoint_info(path);
  check_checkpoint_shape(info, layout);
  std::vector<StateSpec> specs;
  for (const StateBuffer& b : buffers.state) specs.push_back(b.spec);
  // Sampling and evaluation pass no state, on every rank alike: nothing of /optim to read.
  if (!buffers.rule.empty()) require_optimizer_state(info, buffers.rule, specs);

  H5Handle file = open_parallel_file(comm, path);
  const std::vector<const LocalTensor*> tiles = ckpt::tiles_by_canonical(layout);
  std::vector<StateHostLayout> at;
  for (const StateBuffer& b : buffers.state) at.push_back(state_host_layout(b.spec, layout, 0));
  std::vector<std::string> paths;
  std::vector<uint64_t> sums;
  std::string bad;  // this rank's first value out of range
  for (size_t i = 0; i < tiles.size(); ++i) {
    const ParamTensor& c = layout.canonical.tensors[i];
    const LocalTensor* t = tiles[i];
    const bool counted = t && writer && t->owner;
    const size_t off = t ? t->offset : 0;
    for (const ckpt::TensorDataset& d : ckpt::tensor_datasets(c, specs)) {
      paths.push_back(d.path);
      if (d.state < 0) {
        sums.push_back(read_tensor(file.get(), path, d.path, layout, c, t, counted,
                                   buffers.params + off, collective_bytes, false, &bad));
        continue;
      }
      const StateBuffer& b = buffers.state[size_t(d.state)];
      if (b.spec.whole()) {
        const size_t j = size_t(t ? t - layout.tensors.data() : 0);
        sums.push_back(read_whole(file.get(), path, d.path, d.shape, t != nullptr,
                                  writer && ckpt::holds_first_element(t),
                                  t ? b.data + at[size_t(d.state)].offset[j] : nullptr,
                                  b.spec.non_negative, &bad));
      } else {
        sums.push_back(read_tensor(file.get(), path, d.path, layout, c, t, counted, b.data + off,
                                   collective_bytes, b.spec.non_negative, &bad));
      }
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
  verify_checksums(file.get(), path, paths, sums);
  if (bad = agree_on_failure(comm, bad); !bad.empty())
    throw UserError(path + ": " + bad + " (a checkpoint holds finite weights and moments, and "
                    "non-negative exp_avg_sq)");
  return info;
}

CheckpointInfo verify_checkpoint(const std::string& path) {
  const CheckpointInfo info = read_checkpoint_info(path);
  const LocalLayout whole =
      make_local_layout(info.shape, 1, 0, 0, info.shape.n_layer, true, true);
  // Every state tensor the file holds, by its rule's names.
  std::vector<StateSpec> specs;
  for (const StateSpec& spec : rule_state_names(info.optim_rule))
    if (std::find(info.optim_state.begin(), info.optim_state.end(), spec.name) !=
        info.optim_state.end())
      specs.push_back(spec);
  // The tensors the shape promises must be in the file before memory is taken for them.
  std::vector<size_t> sizes = {whole.total};
  for (const StateSpec& spec : specs)
    sizes.push_back(state_host_layout(spec, whole, whole.total).total);
  double need = 0;
  for (const ParamTensor& c : whole.canonical.tensors)
    for (const ckpt::TensorDataset& d : ckpt::tensor_datasets(c, specs)) {
      double n = 1;
      for (size_t x : d.shape) n *= double(x);
      need += n * sizeof(float);
    }
  std::error_code ec;
  const double have = double(fs::file_size(path, ec));
  if (need > have)
    throw UserError(path + ": its model shape needs " + human_bytes(need) + " of tensors, but the "
                    "file has " + human_bytes(have) + " (truncated, or not what its attributes say)");
  std::vector<std::vector<float>> host(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) host[k].resize(sizes[k]);
  std::vector<StateBuffer> state;
  for (size_t k = 0; k < specs.size(); ++k) state.push_back({specs[k], host[k + 1].data()});
  return read_checkpoint(MPI_COMM_SELF, path, whole, true,
                         {host[0].data(), specs.empty() ? "" : info.optim_rule, state});
}

std::string resolve_checkpoint(const std::string& dir_or_file) {
  struct stat st;
  // Anything there but a directory (a file, a FIFO, a link loop) is for the reader to accept or
  // to refuse by name.
  if (stat(dir_or_file.c_str(), &st) != 0) return errno == ENOENT ? "" : dir_or_file;
  if (!S_ISDIR(st.st_mode)) return dir_or_file;
  std::error_code ec;
  const fs::path dir(dir_or_file);
  std::string name;
  if (fs::is_regular_file(dir / "latest", ec)) {
    std::ifstream latest(dir / "latest");
    char line[64] = {};  // "step_NNNNNNNN.h5": a damaged `latest` is no reason to read it all
    latest.getline(line, sizeof line);
    name = line;
  }
  if (!name.empty() && fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  // No usable `latest` (a job killed between rename and update): newest complete file wins.
  std::string best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (f.size() == 16 && f.rfind("step_", 0) == 0 && f.substr(13) == ".h5" && f > best) best = f;
  }
  return best.empty() ? "" : (dir / best).string();
}

std::string newest_sound_checkpoint(const std::string& dir, std::vector<std::string>* skipped) {
  for (std::string path = resolve_checkpoint(dir); !path.empty(); path = resolve_checkpoint(dir)) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path;  // not a directory
    std::string why;
    bool sound = false;
    try {
      verify_checkpoint(path);
      sound = true;
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (sound) {
      // `latest` named one passed over: it names this one now, so that nothing reads a name gone.
      if (!skipped->empty())
        if (std::string failed = write_file_atomically((fs::path(dir) / "latest").string(),
                                                       fs::path(path).filename().string() + "\n",
                                                       /*durable=*/true);
            !failed.empty())
          throw UserError("checkpoint.restart = auto: " + failed, kExitIO);
      return path;
    }
    const std::string aside = path + ".damaged";
    if (std::rename(path.c_str(), aside.c_str()) != 0)
      throw UserError("checkpoint.restart = auto: " + why + "; and cannot rename it to " + aside +
                          ": " + std::strerror(errno),
                      kExitIO);
    skipped->push_back("restart: skipped " + fs::path(path).filename().string() + " (" + why +
                       "): renamed to " + fs::path(aside).filename().string());
  }
  if (!skipped->empty()) unlink((fs::path(dir) / "latest").c_str());  // it names nothing now
  return "";
}

}  // namespace tessera
