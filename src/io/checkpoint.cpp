#include "io/checkpoint.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/rng.hpp"
#include "common/version.hpp"
#include "io/hdf5_util.hpp"
#include "io/tokenizer.hpp"

namespace tessera {

namespace fs = std::filesystem;

uint64_t element_hash(uint64_t canonical_index, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return mix64((canonical_index << 32) ^ bits ^ 0x5DEECE66DULL);
}

uint64_t tile_checksum(const LocalLayout& layout, const LocalTensor& t, const float* values) {
  // A sum of per-element hashes is independent of how the tensor is split between ranks and of
  // the order in which the parts are added.
  uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t i = 0; i < t.numel; ++i)
    sum += element_hash(layout.canonical_index(t, i), values[i]);
  return sum;
}

namespace {

std::string step_name(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return name;
}

H5Handle create_parallel_file(MPI_Comm comm, const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Pset_all_coll_metadata_ops(fapl.get(), true);
  H5Pset_coll_metadata_write(fapl.get(), true);
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.valid()) throw UserError("cannot create checkpoint file " + path, kExitIO);
  return file;
}

H5Handle open_parallel_file(MPI_Comm comm, const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) throw UserError("cannot open checkpoint " + path, kExitIO);
  return file;
}

H5Handle transfer(H5FD_mpio_xfer_t mode) {
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), mode);
  return dxpl;
}

H5Handle make_group(hid_t parent, const std::string& name) {
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Handle group(H5Gcreate2(parent, name.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) throw UserError("HDF5: cannot create group " + name, kExitIO);
  return group;
}

// Selects this rank's blocks of a canonical tensor in the dataset's dataspace, or nothing when
// it holds none. A vector's dataspace has rank 1, so only row0/rows of each block are read.
void select_tile(hid_t space, const LocalTensor* t) {
  if (t == nullptr) {
    H5Sselect_none(space);
    return;
  }
  bool first = true;
  for (const Block& b : t->blocks) {
    const hsize_t start[2] = {b.row0, b.col0}, count[2] = {b.rows, b.cols};
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count,
                        nullptr);
    first = false;
  }
}

// The local buffer as a 1-D dataspace; one element, unselected, when this rank writes nothing.
H5Handle memory_space(const LocalTensor* t) {
  const hsize_t n = t ? t->numel : 1;
  H5Handle mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (!t) H5Sselect_none(mem.get());
  return mem;
}

// Collective MPI-IO transfers for tensors of at least `collective_bytes` (two-phase aggregation
// pays for large data on a parallel file system); independent ones for the small tensors, where a
// collective round per tensor costs more than the data. Either way each rank moves only its tile.
H5FD_mpio_xfer_t transfer_mode(const ParamTensor& c, long collective_bytes) {
  return double(c.numel) * sizeof(float) >= double(collective_bytes) ? H5FD_MPIO_COLLECTIVE
                                                                     : H5FD_MPIO_INDEPENDENT;
}

// Creates the dataset of canonical tensor c (collective) and writes this rank's tile, if it holds
// one it owns. Returns this rank's part of the dataset's checksum.
uint64_t write_tensor(hid_t file, const std::string& path, const LocalLayout& layout,
                      const ParamTensor& c, const LocalTensor* t, const float* local,
                      long collective_bytes) {
  std::vector<hsize_t> dims(c.shape.begin(), c.shape.end());
  H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Handle dset(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(),
                           H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
  if (!dset.valid()) throw UserError("HDF5: cannot create dataset " + path, kExitIO);
  H5Handle file_space(H5Dget_space(dset.get()), H5Sclose);
  select_tile(file_space.get(), t);
  H5Handle mem = memory_space(t);
  const H5FD_mpio_xfer_t mode = transfer_mode(c, collective_bytes);
  // Independent: a rank without a tile has nothing to do. Collective: every rank takes part.
  if ((t || mode == H5FD_MPIO_COLLECTIVE) &&
      H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mem.get(), file_space.get(), transfer(mode).get(),
               local) < 0)
    throw UserError("HDF5: write of " + path + " failed", kExitIO);
  return t ? tile_checksum(layout, *t, local) : 0;
}

// Reads this rank's tile of canonical tensor c (every rank that holds one, owner or not).
// Returns this rank's part of the checksum when it is `counted`, else 0.
uint64_t read_tensor(hid_t file, const std::string& ckpt, const std::string& path,
                     const LocalLayout& layout, const ParamTensor& c, const LocalTensor* t,
                     bool counted, float* local, long collective_bytes) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(ckpt + ": missing dataset /" + path);
  H5Handle dset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (std::vector<size_t>(dims.begin(), dims.end()) != c.shape)
    throw UserError(ckpt + ": /" + path + " has a different shape from the deck's model");
  select_tile(space.get(), t);
  H5Handle mem = memory_space(t);
  const H5FD_mpio_xfer_t mode = transfer_mode(c, collective_bytes);
  if ((t || mode == H5FD_MPIO_COLLECTIVE) &&
      H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), transfer(mode).get(), local) < 0)
    throw UserError(ckpt + ": read of /" + path + " failed", kExitIO);
  return t && counted ? tile_checksum(layout, *t, local) : 0;
}

// The /checksum/... datasets: created by every rank, written by rank 0 alone.
void write_checksums(hid_t file, const std::vector<std::string>& paths,
                     const std::vector<uint64_t>& sums, int rank) {
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string path = "checksum/" + paths[i];
    H5Handle cset(H5Dcreate2(file, path.c_str(), H5T_STD_U64LE, scalar.get(), lcpl.get(),
                             H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose);
    if (!cset.valid() ||
        (rank == 0 && H5Dwrite(cset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL,
                               transfer(H5FD_MPIO_INDEPENDENT).get(), &sums[i]) < 0))
      throw UserError("HDF5: cannot write /" + path, kExitIO);
  }
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
                                 transfer(H5FD_MPIO_INDEPENDENT).get(), &stored) < 0)
      throw UserError(ckpt + ": missing checksum for /" + paths[i]);
    if (stored != sums[i])
      throw UserError(ckpt + ": checksum mismatch in /" + paths[i] + " (file corrupt?)", kExitIO);
  }
}

// The local tensor holding canonical tensor i on this rank, or null.
std::vector<const LocalTensor*> tiles_by_canonical(const LocalLayout& layout) {
  std::vector<const LocalTensor*> tiles(layout.canonical.tensors.size(), nullptr);
  for (const LocalTensor& t : layout.tensors) tiles[t.canonical] = &t;
  return tiles;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError("cannot write " + tmp, kExitIO);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw UserError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno), kExitIO);
}

int64_t require_int(hid_t obj, const std::string& file, const std::string& name) {
  auto v = h5_read_int_attr(obj, name);
  if (!v) throw UserError(file + ": missing attribute " + name + " (not a tessera checkpoint?)");
  return *v;
}

}  // namespace

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const LocalLayout& layout,
                             bool writer, const ModelBuffers& buffers, const TrainState& state,
                             const std::string& deck_yaml, const TokenizerInfo& tokenizer,
                             const std::string& saved_layout, long collective_bytes) {
  hdf5_quiet();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int ok = 1;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    ok = !ec;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  if (!ok) throw UserError("cannot create checkpoint directory " + dir, kExitIO);

  const std::string final_path = (fs::path(dir) / step_name(state.step)).string();
  const std::string tmp_path = final_path + ".tmp";
  {
    H5Handle file = create_parallel_file(comm, tmp_path);
    const hid_t root = file.get();
    h5_write_string_attr(root, "format", "tessera-checkpoint");
    h5_write_int_attr(root, "format_version", kCheckpointFormatVersion);
    h5_write_int_attr(root, "step", state.step);
    h5_write_int_attr(root, "tokens_seen", state.tokens_seen);
    h5_write_string_attr(root, "deck", deck_yaml);
    h5_write_string_attr(root, "software_version", kSoftwareVersion);
    h5_write_string_attr(root, "saved_layout", saved_layout);

    H5Handle model = make_group(root, "model");
    const ModelShape& s = layout.canonical.shape;
    h5_write_int_attr(model.get(), "n_layer", s.n_layer);
    h5_write_int_attr(model.get(), "n_head", s.n_head);
    h5_write_int_attr(model.get(), "n_embd", s.n_embd);
    h5_write_int_attr(model.get(), "block_size", s.block_size);
    h5_write_int_attr(model.get(), "vocab_size", s.vocab_size);
    h5_write_int_attr(model.get(), "padded_vocab", s.padded_vocab);
    h5_write_string_attr(model.get(), "arch", arch_name(s.arch));
    h5_write_int_attr(model.get(), "n_kv_head", s.n_kv_head);
    h5_write_int_attr(model.get(), "ffn_hidden", s.ffn_hidden);
    h5_write_int_attr(model.get(), "tie_embeddings", s.tied ? 1 : 0);
    h5_write_double_attr(model.get(), "norm_eps", s.norm_eps);
    h5_write_double_attr(model.get(), "rope_theta", s.rope_theta);

    H5Handle optim = make_group(root, "optim");
    h5_write_int_attr(optim.get(), "step", state.step);
    H5Handle train = make_group(root, "train");
    h5_write_int_attr(train.get(), "next_sample", state.next_sample);
    h5_write_int_attr(train.get(), "seed", int64_t(state.seed));
    h5_write_int_attr(train.get(), "vocab_size", s.vocab_size);
    h5_write_double_attr(train.get(), "lr", state.lr);
    h5_write_string_attr(train.get(), "data_sources", state.data_sources);
    h5_write_string_attr(train.get(), "data_position", state.data_position);
    H5Handle tok = make_group(root, "tokenizer");
    h5_write_string_attr(tok.get(), "type", tokenizer.type);
    h5_write_int_attr(tok.get(), "vocab_size", tokenizer.vocab_size);
    h5_write_int_attr(tok.get(), "eot", tokenizer.eot);
    // The sentencepiece model, copied from the token file: `tessera sample` decodes with it.
    write_tokenizer_model(tok.get(), "model", tokenizer.model, rank == 0,
                          transfer(H5FD_MPIO_INDEPENDENT).get());
    const std::vector<const LocalTensor*> tiles = tiles_by_canonical(layout);
    std::vector<std::string> paths;
    std::vector<uint64_t> sums;
    for (size_t i = 0; i < tiles.size(); ++i) {
      const ParamTensor& c = layout.canonical.tensors[i];
      // Replicated copies (other dp ranks, other tp ranks, the tied wte copy) stay silent.
      const LocalTensor* t = writer && tiles[i] && tiles[i]->owner ? tiles[i] : nullptr;
      const size_t off = t ? t->offset : 0;
      const std::pair<const char*, const float*> parts[] = {{"model/", buffers.params},
                                                            {"optim/exp_avg/", buffers.exp_avg},
                                                            {"optim/exp_avg_sq/", buffers.exp_avg_sq}};
      for (const auto& [prefix, base] : parts) {
        paths.push_back(prefix + c.name);
        sums.push_back(write_tensor(root, paths.back(), layout, c, t, base + off, collective_bytes));
      }
    }
    // One reduction for all checksums: each is the sum of the owners' parts.
    MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
    write_checksums(root, paths, sums, rank);
    if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0)
      throw UserError("HDF5: flush of " + tmp_path + " failed", kExitIO);
  }
  MPI_Barrier(comm);
  if (rank == 0) {
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      ok = 0;
    else
      write_text_atomically((fs::path(dir) / "latest").string(), step_name(state.step) + "\n");
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  if (!ok) throw UserError("cannot rename " + tmp_path + " to " + final_path, kExitIO);
  return final_path;
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  hdf5_quiet();
  if (access(path.c_str(), R_OK) != 0)
    throw UserError("cannot read checkpoint " + path + ": no such file or not readable", kExitIO);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw UserError(path + ": not an HDF5 file (a tessera checkpoint is step_NNNNNNNN.h5)");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw UserError("cannot open checkpoint " + path, kExitIO);
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
  info.state.step = require_int(root, path, "step");
  info.state.tokens_seen = require_int(root, path, "tokens_seen");
  for (const char* group : {"model", "train", "tokenizer"})
    if (H5Lexists(root, group, H5P_DEFAULT) <= 0)
      throw UserError(path + ": missing group /" + group);
  info.has_optimizer = H5Lexists(root, "optim", H5P_DEFAULT) > 0;
  H5Handle model(H5Gopen2(root, "model", H5P_DEFAULT), H5Gclose);
  info.shape.n_layer = int(require_int(model.get(), path, "n_layer"));
  info.shape.n_head = int(require_int(model.get(), path, "n_head"));
  info.shape.n_embd = int(require_int(model.get(), path, "n_embd"));
  info.shape.block_size = int(require_int(model.get(), path, "block_size"));
  info.shape.vocab_size = int(require_int(model.get(), path, "vocab_size"));
  info.shape.padded_vocab = int(require_int(model.get(), path, "padded_vocab"));
  // Checkpoints from before the LLaMA family are GPT-2's.
  const std::string arch = h5_read_string_attr(model.get(), "arch").value_or("gpt2");
  if (arch != "gpt2" && arch != "llama")
    throw UserError(path + ": /model attribute arch '" + arch + "' is neither gpt2 nor llama");
  info.shape.arch = arch == "llama" ? Arch::Llama : Arch::Gpt2;
  info.shape.n_kv_head =
      int(h5_read_int_attr(model.get(), "n_kv_head").value_or(info.shape.n_head));
  info.shape.ffn_hidden =
      int(h5_read_int_attr(model.get(), "ffn_hidden").value_or(4 * info.shape.n_embd));
  info.shape.tied = h5_read_int_attr(model.get(), "tie_embeddings").value_or(1) != 0;
  info.shape.norm_eps = h5_read_double_attr(model.get(), "norm_eps").value_or(1e-5);
  info.shape.rope_theta = h5_read_double_attr(model.get(), "rope_theta").value_or(10000.0);
  H5Handle train(H5Gopen2(root, "train", H5P_DEFAULT), H5Gclose);
  info.state.next_sample = require_int(train.get(), path, "next_sample");
  info.state.seed = uint64_t(require_int(train.get(), path, "seed"));
  info.state.lr = h5_read_double_attr(train.get(), "lr").value_or(0.0);
  info.state.data_sources = h5_read_string_attr(train.get(), "data_sources").value_or("");
  info.state.data_position = h5_read_string_attr(train.get(), "data_position").value_or("");
  H5Handle tok(H5Gopen2(root, "tokenizer", H5P_DEFAULT), H5Gclose);
  info.tokenizer.type = h5_read_string_attr(tok.get(), "type").value_or("byte");
  info.tokenizer.vocab_size = require_int(tok.get(), path, "vocab_size");
  info.tokenizer.eot = require_int(tok.get(), path, "eot");
  info.tokenizer.model = read_tokenizer_model(tok.get(), path, "model");
  check_tokenizer(info.tokenizer, path);
  return info;
}

CheckpointInfo read_checkpoint(MPI_Comm comm, const std::string& path, const LocalLayout& layout,
                               bool writer, const ModelBuffers& buffers, long collective_bytes) {
  CheckpointInfo info = read_checkpoint_info(path);
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
  if (!diff.empty()) throw UserError(path + ": model shape differs from the deck: " + diff);
  if (buffers.exp_avg && !info.has_optimizer)
    throw UserError(path + ": holds no optimizer state (no /optim: imported weights?), so no run "
                    "continues from it; start a new one with checkpoint.init_from");

  H5Handle file = open_parallel_file(comm, path);
  const std::vector<const LocalTensor*> tiles = tiles_by_canonical(layout);
  std::vector<std::string> paths;
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const ParamTensor& c = layout.canonical.tensors[i];
    const LocalTensor* t = tiles[i];
    const bool counted = t && writer && t->owner;
    const size_t off = t ? t->offset : 0;
    std::vector<std::pair<const char*, float*>> parts = {{"model/", buffers.params}};
    // Sampling and evaluation pass no moment buffers, on every rank alike: nothing to read.
    if (buffers.exp_avg)
      parts.insert(parts.end(), {{"optim/exp_avg/", buffers.exp_avg},
                                 {"optim/exp_avg_sq/", buffers.exp_avg_sq}});
    for (const auto& [prefix, base] : parts) {
      paths.push_back(prefix + c.name);
      sums.push_back(read_tensor(file.get(), path, paths.back(), layout, c, t, counted, base + off,
                                 collective_bytes));
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
  verify_checksums(file.get(), path, paths, sums);
  return info;
}

std::string resolve_checkpoint(const std::string& dir_or_file) {
  std::error_code ec;
  if (fs::is_regular_file(dir_or_file, ec)) return dir_or_file;
  if (!fs::is_directory(dir_or_file, ec)) return "";
  const fs::path dir(dir_or_file);
  std::ifstream latest(dir / "latest");
  std::string name;
  if (latest >> name && fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  // No usable `latest` (a job killed between rename and update): newest complete file wins.
  std::string best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (f.size() == 16 && f.rfind("step_", 0) == 0 && f.substr(13) == ".h5" && f > best) best = f;
  }
  return best.empty() ? "" : (dir / best).string();
}

}  // namespace tessera
