#include "io/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "common/rng.hpp"
#include "common/version.hpp"
#include "io/contained.hpp"
#include "io/hdf5_util.hpp"
#include "io/tokenizer.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace fs = std::filesystem;

// The groups a checkpoint keeps each canonical tensor in: the weights, then AdamW's moments
// (absent from imported weights).
constexpr const char* kTensorGroups[] = {"model/", "optim/exp_avg/", "optim/exp_avg_sq/"};

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

std::string state_text(const TrainState& st, const ModelShape& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "step=%lld tokens_seen=%lld next_sample=%lld seed=%llu lr=%.17g n_layer=%d "
                "n_head=%d n_embd=%d block_size=%d vocab_size=%d padded_vocab=%d arch=%s "
                "n_kv_head=%d ffn_hidden=%d tied=%d norm_eps=%.17g rope_theta=%.17g",
                (long long)st.step, (long long)st.tokens_seen, (long long)st.next_sample,
                (unsigned long long)st.seed, st.lr, s.n_layer, s.n_head, s.n_embd, s.block_size,
                s.vocab_size, s.padded_vocab, arch_name(s.arch), s.n_kv_head, s.ffn_hidden,
                s.tied ? 1 : 0, s.norm_eps, s.rope_theta);
  return std::string(buf) + " data_sources=" + st.data_sources +
         " data_position=" + st.data_position;
}

uint64_t state_checksum(const TrainState& state, const ModelShape& shape) {
  return mix64(fnv1a64(state_text(state, shape)));
}

std::string first_bad_value(const std::string& name, const float* values, size_t n,
                            bool non_negative) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]) || (non_negative && values[i] < 0)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", double(values[i]));
      return name + " holds " + buf + " at element " + std::to_string(i) + " of this rank's tile";
    }
  return "";
}

namespace {

std::string step_name(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return name;
}

H5Handle parallel_access(MPI_Comm comm) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Pset_all_coll_metadata_ops(fapl.get(), true);
  H5Pset_coll_metadata_write(fapl.get(), true);
  return fapl;
}

H5Handle open_parallel_file(MPI_Comm comm, const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Handle file(H5Fopen(mpiio_name(path).c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid())
    throw UserError("cannot open checkpoint " + path + ": " + h5_error_reason(), kExitIO);
  return file;
}

H5Handle transfer(H5FD_mpio_xfer_t mode) {
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), mode);
  return dxpl;
}

// The first failure of a write on this rank ("" while all is well). Every rank goes on making the
// same HDF5 calls after one (they are collective) until the ranks next agree on failures.
struct WriteFailure {
  std::string what;
  void note(bool failed, const std::string& doing) {
    if (failed && what.empty()) what = doing + ": " + h5_error_reason();
  }
};

H5Handle make_group(hid_t parent, const std::string& name, WriteFailure& failure) {
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Handle group(H5Gcreate2(parent, name.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  failure.note(!group.valid(), "cannot create group /" + name);
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

// Creates dataset `path` (collective) of `type` and shape dims ({} = scalar).
H5Handle create_dataset(hid_t file, const std::string& path, hid_t type,
                        const std::vector<size_t>& dims, WriteFailure& failure) {
  const std::vector<hsize_t> d(dims.begin(), dims.end());
  H5Handle space(d.empty() ? H5Screate(H5S_SCALAR)
                           : H5Screate_simple(int(d.size()), d.data(), nullptr),
                 H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Handle dset(H5Dcreate2(file, path.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose);
  failure.note(!dset.valid(), "cannot create /" + path);
  return dset;
}

// Writes this rank's tile of canonical tensor c into its dataset, if it holds one it owns.
// Returns this rank's part of the dataset's checksum.
uint64_t write_tensor(hid_t dset, const std::string& path, const LocalLayout& layout,
                      const ParamTensor& c, const LocalTensor* t, const float* local,
                      long collective_bytes, WriteFailure& failure) {
  if (dset < 0) return 0;
  H5Handle file_space(H5Dget_space(dset), H5Sclose);
  select_tile(file_space.get(), t);
  H5Handle mem = memory_space(t);
  const H5FD_mpio_xfer_t mode = transfer_mode(c, collective_bytes);
  // Independent: a rank without a tile has nothing to do. Collective: every rank takes part.
  if (t || mode == H5FD_MPIO_COLLECTIVE)
    failure.note(H5Dwrite(dset, H5T_NATIVE_FLOAT, mem.get(), file_space.get(),
                          transfer(mode).get(), local) < 0,
                 "write of /" + path + " failed");
  return t ? tile_checksum(layout, *t, local) : 0;
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
                     bool counted, float* local, long collective_bytes, std::string* bad) {
  H5Handle dset = open_tensor(file, ckpt, path, c.shape);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  select_tile(space.get(), t);
  H5Handle mem = memory_space(t);
  const H5FD_mpio_xfer_t mode = transfer_mode(c, collective_bytes);
  if ((t || mode == H5FD_MPIO_COLLECTIVE) &&
      H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), transfer(mode).get(), local) < 0)
    throw UserError(ckpt + ": read of /" + path + " failed", kExitIO);
  // A value no training state can hold: found after the checksums (a damaged file is an I/O
  // error), reported as bad input.
  if (t && bad->empty())
    *bad = first_bad_value("/" + path, local, t->numel, path.rfind("optim/exp_avg_sq/", 0) == 0);
  return t && counted ? tile_checksum(layout, *t, local) : 0;
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

// "kept step M": what a failed write leaves as the newest checkpoint.
std::string kept(const std::string& dir) {
  const std::string newest = resolve_checkpoint(dir);
  if (newest.empty()) return "no earlier checkpoint to keep";
  const std::string name = fs::path(newest).filename().string();
  return "kept step " + std::to_string(std::atoll(name.c_str() + 5)) + " (" + name + ")";
}

bool no_space(const std::string& reason) {
  return reason.find("No space left") != std::string::npos ||
         reason.find("Disk quota") != std::string::npos ||
         reason.find("File too large") != std::string::npos;
}

// Rank 0, once every rank has the new file open: its expected size reserved with fallocate, so
// that a full disk or quota is found before a byte of data is written and the writes cannot run
// out of space (HDF5 trims the file to its real size when it closes it). Where the file system
// cannot reserve, its free space is compared instead. Returns "" or the problem.
std::string reserve_space(const std::string& tmp, uint64_t bytes) {
  const int fd = open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  std::string why;
  if (fallocate(fd, 0, 0, off_t(bytes)) != 0) {
    const int err = errno;
    if (err == EOPNOTSUPP || err == ENOSYS) {
      const long long free = free_bytes(tmp);
      if (free >= 0 && uint64_t(free) < bytes) why = std::strerror(ENOSPC);
    } else {
      why = std::strerror(err);
    }
  }
  close(fd);
  return why.empty() ? "" : "cannot write " + tmp + ": " + why;
}

// Rank 0: a file holding `bytes` of the disk while the data is written, given back right before
// HDF5 writes metadata again (the last flush, or the close after a failure). A parallel flush
// whose metadata write fails on one rank leaves the others waiting inside HDF5 forever, so the
// metadata must always find room, however full the data made the disk. Returns "" or the problem.
std::string hold_room(const std::string& path, uint64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot write " + path + ": " + std::strerror(errno);
  int err = fallocate(fd, 0, 0, off_t(bytes)) == 0 ? 0 : errno;
  if (err == EOPNOTSUPP || err == ENOSYS) {  // no fallocate: write the bytes
    const std::vector<char> zeros(1 << 16, 1);
    err = 0;
    for (uint64_t done = 0; done < bytes && err == 0; done += zeros.size())
      if (pwrite(fd, zeros.data(), zeros.size(), off_t(done)) < 0) err = errno;
    if (err == 0 && fsync(fd) != 0) err = errno;
  }
  close(fd);
  if (err == 0) return "";
  unlink(path.c_str());
  return "cannot write " + path + ": " + std::strerror(err);
}

// The root attributes and the /model, /optim, /train and /tokenizer groups. Metadata is made the
// same way on every rank, so it fails (if ever) on all of them alike.
void write_metadata(hid_t root, const LocalLayout& layout, const TrainState& state,
                    const std::string& deck_yaml, const TokenizerInfo& tokenizer,
                    const std::string& saved_layout, int rank, WriteFailure& failure) {
  try {
    h5_write_string_attr(root, "format", "tessera-checkpoint");
    h5_write_int_attr(root, "format_version", kCheckpointFormatVersion);
    h5_write_int_attr(root, "step", state.step);
    h5_write_int_attr(root, "tokens_seen", state.tokens_seen);
    h5_write_string_attr(root, "deck", deck_yaml);
    h5_write_string_attr(root, "software_version", kSoftwareVersion);
    h5_write_string_attr(root, "saved_layout", saved_layout);
    h5_write_int_attr(root, "state_checksum",
                      int64_t(state_checksum(state, layout.canonical.shape)));

    H5Handle model = make_group(root, "model", failure);
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

    H5Handle optim = make_group(root, "optim", failure);
    h5_write_int_attr(optim.get(), "step", state.step);
    H5Handle train = make_group(root, "train", failure);
    h5_write_int_attr(train.get(), "next_sample", state.next_sample);
    h5_write_int_attr(train.get(), "seed", int64_t(state.seed));
    h5_write_int_attr(train.get(), "vocab_size", s.vocab_size);
    h5_write_double_attr(train.get(), "lr", state.lr);
    h5_write_string_attr(train.get(), "data_sources", state.data_sources);
    h5_write_string_attr(train.get(), "data_position", state.data_position);
    H5Handle tok = make_group(root, "tokenizer", failure);
    h5_write_string_attr(tok.get(), "type", tokenizer.type);
    h5_write_int_attr(tok.get(), "vocab_size", tokenizer.vocab_size);
    h5_write_int_attr(tok.get(), "eot", tokenizer.eot);
    // The sentencepiece model, copied from the token file: `tessera sample` decodes with it.
    write_tokenizer_model(tok.get(), "model", tokenizer.model, rank == 0,
                          transfer(H5FD_MPIO_INDEPENDENT).get());
  } catch (const std::exception& e) {
    failure.note(true, e.what());
  }
}

}  // namespace

std::string mpiio_name(const std::string& path) {
  return path.find(':') == std::string::npos ? path : "ufs:" + path;
}

uint64_t checkpoint_bytes(const LocalLayout& layout, const TokenizerInfo& tokenizer,
                          size_t text_bytes) {
  const uint64_t datasets = 6 * layout.canonical.tensors.size();  // 3 tensors, 3 checksums
  return 3 * uint64_t(layout.canonical.total) * sizeof(float) + datasets * (8 + 1024) +
         tokenizer.model.size() + 2 * text_bytes + (256 << 10);
}

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const LocalLayout& layout,
                             bool writer, const ModelBuffers& buffers, const TrainState& state,
                             const std::string& deck_yaml, const TokenizerInfo& tokenizer,
                             const std::string& saved_layout, long collective_bytes,
                             bool reserve) {
  hdf5_quiet();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string final_path = (fs::path(dir) / step_name(state.step)).string();
  const std::string tmp_path = final_path + ".tmp";
  const uint64_t bytes =
      checkpoint_bytes(layout, tokenizer,
                       deck_yaml.size() + state.data_sources.size() + state.data_position.size());
  // Every failure ends here, on every rank at once: the tmp file removed, `latest` untouched.
  auto give_up = [&](const std::string& why) {
    std::string keep = rank == 0 ? kept(dir) : "";
    keep = agree_on_failure(comm, keep);
    if (rank == 0) unlink(tmp_path.c_str());
    const std::string where = "checkpoint step " + std::to_string(state.step) + ": ";
    if (no_space(why)) {
      const long long free = rank == 0 ? free_bytes(dir) : -1;
      throw UserError(where + "disk full on " + dir + " (a checkpoint needs about " +
                          human_bytes(double(bytes)) +
                          (free >= 0 ? ", " + human_bytes(double(free)) + " are free" : "") + "): " +
                          keep,
                      kExitIO);
    }
    throw UserError(where + why + ": " + keep, kExitIO);
  };

  // HDF5 cannot close a file whose metadata it cannot write (and then fails inside MPI_Finalize),
  // so the metadata must always find room: there must be room for it before the file is made,
  // and it is written, and flushed, before any data.
  const uint64_t metadata_bytes = 6 * layout.canonical.tensors.size() * 1024 + (64 << 10);
  const std::string room_path = (fs::path(dir) / kRoomFile).string();
  std::string failure;
  if (rank == 0) {
    failure = make_directories(dir);
    const long long free = failure.empty() ? free_bytes(dir) : -1;
    if (free >= 0 && uint64_t(free) < 2 * metadata_bytes)  // the metadata, and room held for it
      failure = "cannot write " + tmp_path + ": " + std::strerror(ENOSPC);
  }
  if (std::string why = agree_on_failure(comm, failure); !why.empty()) give_up(why);
  // Never a checkpoint of weights or moments that are not finite: it would poison every restart.
  std::string bad;
  for (const LocalTensor& t : layout.tensors) {
    const ParamTensor& c = layout.canonical.tensors[t.canonical];
    const std::pair<const char*, const float*> parts[] = {
        {"/model/", buffers.params}, {"/optim/exp_avg/", buffers.exp_avg},
        {"/optim/exp_avg_sq/", buffers.exp_avg_sq}};
    for (const auto& [prefix, base] : parts)
      if (bad.empty() && base)
        bad = first_bad_value(prefix + c.name, base + t.offset, t.numel, false);
  }
  if (bad = agree_on_failure(comm, bad); !bad.empty())
    throw UserError("checkpoint step " + std::to_string(state.step) + ": refused: " + bad +
                        ": nothing written, " + (rank == 0 ? kept(dir) : std::string("")),
                    kExitAnomaly);

  WriteFailure local;
  H5Handle file(H5Fcreate(mpiio_name(tmp_path).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT,
                          parallel_access(comm).get()),
                H5Fclose);
  local.note(!file.valid(), "cannot create " + tmp_path);
  if (std::string why = agree_on_failure(comm, local.what); !why.empty()) give_up(why);
  if (rank == 0 && reserve) local.what = reserve_space(tmp_path, bytes);
  failure = agree_on_failure(comm, local.what);
  {
    // 1. Every object: attributes, groups, the tensors' and the checksums' datasets; flushed.
    const hid_t root = file.get();
    std::vector<std::string> paths;
    std::vector<H5Handle> datasets, checksum_sets;
    if (failure.empty()) {
      write_metadata(root, layout, state, deck_yaml, tokenizer, saved_layout, rank, local);
      for (const ParamTensor& c : layout.canonical.tensors)
        for (const char* prefix : kTensorGroups) {
          paths.push_back(prefix + c.name);
          datasets.push_back(create_dataset(root, paths.back(), H5T_IEEE_F32LE, c.shape, local));
        }
      for (const std::string& path : paths)
        checksum_sets.push_back(create_dataset(root, "checksum/" + path, H5T_STD_U64LE, {}, local));
      local.note(H5Fflush(root, H5F_SCOPE_GLOBAL) < 0, "flush of " + tmp_path + " failed");
      if (rank == 0 && local.what.empty()) local.what = hold_room(room_path, metadata_bytes);
      failure = agree_on_failure(comm, local.what);
    }
    // 2. The data, tensor by tensor. A write that failed on one rank stops every rank after that
    // tensor, before the next collective call.
    const std::vector<const LocalTensor*> tiles = tiles_by_canonical(layout);
    std::vector<uint64_t> sums;
    for (size_t i = 0; i < tiles.size() && failure.empty(); ++i) {
      const ParamTensor& c = layout.canonical.tensors[i];
      // Replicated copies (other dp ranks, other tp ranks, the tied wte copy) stay silent.
      const LocalTensor* t = writer && tiles[i] && tiles[i]->owner ? tiles[i] : nullptr;
      const size_t off = t ? t->offset : 0;
      const float* parts[] = {buffers.params, buffers.exp_avg, buffers.exp_avg_sq};
      for (int k = 0; k < 3; ++k) {
        const size_t d = 3 * i + size_t(k);
        sums.push_back(write_tensor(datasets[d].get(), paths[d], layout, c, t, parts[k] + off,
                                    collective_bytes, local));
      }
      failure = agree_on_failure(comm, local.what);
    }
    // The metadata's room back to the disk, before HDF5 writes metadata again (the flush below,
    // or the close).
    if (rank == 0) unlink(room_path.c_str());
    if (failure.empty()) {
      // One reduction for all checksums: each is the sum of the owners' parts. Rank 0 writes them.
      MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
      for (size_t d = 0; d < sums.size() && rank == 0; ++d)
        local.note(H5Dwrite(checksum_sets[d].get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL,
                            transfer(H5FD_MPIO_INDEPENDENT).get(), &sums[d]) < 0,
                   "cannot write /checksum/" + paths[d]);
      local.note(H5Fflush(root, H5F_SCOPE_GLOBAL) < 0, "flush of " + tmp_path + " failed");
      failure = agree_on_failure(comm, local.what);
    }
    // A failure leaves the metadata written: what the close still writes is small. Give it the
    // space the partial file took (the data written so far) first.
    if (!failure.empty() && rank == 0) truncate(tmp_path.c_str(), 0);
    MPI_Barrier(comm);
  }  // the datasets close here, the file below
  // One close: a close that failed cannot be retried (HDF5 1.10 leaves the file half torn down).
  if (H5Fclose(file.release()) < 0)
    // HDF5 still holds the file and would close it again inside MPI_Finalize, after MPI is gone:
    // this rank ends the job instead (MPI_Abort).
    throw UserError("checkpoint step " + std::to_string(state.step) + ": " +
                        (failure.empty() ? "" : failure + ", and ") + "the close of " + tmp_path +
                        " failed: " + h5_error_reason() + ": " + kept(dir),
                    kExitIO, /*every_rank=*/false);
  if (!failure.empty()) give_up(failure);

  if (rank == 0) {
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      failure = "cannot rename " + tmp_path + " to " + final_path + ": " + std::strerror(errno);
    else
      failure = write_file_atomically((fs::path(dir) / "latest").string(),
                                      step_name(state.step) + "\n", /*durable=*/true);
  }
  failure = agree_on_failure(comm, failure);
  if (!failure.empty())
    throw UserError("checkpoint step " + std::to_string(state.step) + ": " + failure, kExitIO);
  return final_path;
}

std::string probe_checkpoint_dir(MPI_Comm comm, const std::string& dir) {
  hdf5_quiet();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string probe = (fs::path(dir) / kProbeFile).string();
  const hid_t file =
      H5Fcreate(mpiio_name(probe).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, parallel_access(comm).get());
  std::string failure =
      file < 0 ? "cannot create a checkpoint file in " + dir + " (MPI-IO, as checkpoints are "
                 "written): " + h5_error_reason()
               : "";
  if (file >= 0 && H5Fclose(file) < 0)
    failure = "cannot write a checkpoint file in " + dir + ": " + h5_error_reason();
  failure = agree_on_failure(comm, failure);
  if (rank == 0) unlink(probe.c_str());
  return failure;
}

namespace {

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
  if (arch != "gpt2" && arch != "llama")
    throw UserError(path + ": /model attribute arch '" + arch + "' is neither gpt2 nor llama");
  info.shape.arch = arch == "llama" ? Arch::Llama : Arch::Gpt2;
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
  H5Handle train(H5Gopen2(root, "train", H5P_DEFAULT), H5Gclose);
  info.state.next_sample = require_int(train.get(), path, "next_sample", 0, INT64_MAX);
  info.state.seed = uint64_t(require_int(train.get(), path, "seed"));
  info.state.lr = h5_read_double_attr(train.get(), "lr").value_or(0.0);
  info.state.data_sources = h5_read_string_attr(train.get(), "data_sources").value_or("");
  info.state.data_position = h5_read_string_attr(train.get(), "data_position").value_or("");
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
    const size_t groups = info.has_optimizer ? std::size(kTensorGroups) : 1;
    for (const ParamTensor& c : whole.canonical.tensors)
      for (size_t g = 0; g < groups; ++g)
        open_tensor(file.get(), path, kTensorGroups[g] + c.name, c.shape);
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
  if (!diff.empty()) throw UserError(info.path + ": model shape differs from the deck: " + diff);
}

void require_optimizer_state(const CheckpointInfo& info) {
  if (!info.has_optimizer)
    throw UserError(info.path + ": holds no optimizer state (no /optim: imported weights?), so no "
                    "run continues from it; start a new one with checkpoint.init_from");
}

CheckpointInfo read_checkpoint(MPI_Comm comm, const std::string& path, const LocalLayout& layout,
                               bool writer, const ModelBuffers& buffers, long collective_bytes) {
  CheckpointInfo info = read_checkpoint_info(path);
  check_checkpoint_shape(info, layout);
  if (buffers.exp_avg) require_optimizer_state(info);

  H5Handle file = open_parallel_file(comm, path);
  const std::vector<const LocalTensor*> tiles = tiles_by_canonical(layout);
  std::vector<std::string> paths;
  std::vector<uint64_t> sums;
  std::string bad;  // this rank's first value out of range
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
                                 collective_bytes, &bad));
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
  verify_checksums(file.get(), path, paths, sums);
  if (bad = agree_on_failure(comm, bad); !bad.empty())
    throw UserError(path + ": " + bad + " (a checkpoint holds finite weights and moments, and "
                    "non-negative exp_avg_sq)");
  return info;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (f.size() == 16 && f.rfind("step_", 0) == 0 && f.substr(13) == ".h5") names.push_back(f);
  }
  std::sort(names.begin(), names.end());  // step_NNNNNNNN: the name orders by step
  std::vector<std::string> removed;
  for (size_t i = 0; i + size_t(std::max(keep, 1)) < names.size(); ++i) {
    const fs::path path = fs::path(dir) / names[i];
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      throw UserError("checkpoint.keep: cannot remove " + path.string() + ": " +
                          std::strerror(errno),
                      kExitIO);
    removed.push_back(names[i]);
  }
  return removed;
}

CheckpointInfo verify_checkpoint(const std::string& path) {
  const CheckpointInfo info = read_checkpoint_info(path);
  const LocalLayout whole =
      make_local_layout(info.shape, 1, 0, 0, info.shape.n_layer, true, true);
  // The tensors the shape promises must be in the file before memory is taken for them.
  const double need = double(whole.canonical.total) * sizeof(float) * (info.has_optimizer ? 3 : 1);
  std::error_code ec;
  const double have = double(fs::file_size(path, ec));
  if (need > have)
    throw UserError(path + ": its model shape needs " + human_bytes(need) + " of tensors, but the "
                    "file has " + human_bytes(have) + " (truncated, or not what its attributes say)");
  std::vector<float> p(whole.total), m, v;
  if (info.has_optimizer) {
    m.resize(whole.total);
    v.resize(whole.total);
  }
  return read_checkpoint(MPI_COMM_SELF, path, whole, true,
                         {p.data(), info.has_optimizer ? m.data() : nullptr,
                          info.has_optimizer ? v.data() : nullptr});
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

}  // namespace tessera
