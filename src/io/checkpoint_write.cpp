// Writing checkpoints: the collective write of step_NNNNNNNN.h5.tmp (disk space reserved and
// held for HDF5's metadata, values checked, metadata then data then checksums, every failure
// agreed on by all ranks), its rename and `latest`; the size estimate, the start-up probe of a
// checkpoint directory and checkpoint.keep's pruning.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/files.hpp"
#include "common/version.hpp"
#include "io/checkpoint_format.hpp"
#include "io/hdf5_util.hpp"
#include "io/io_error_watch.hpp"
#include "io/tokenizer.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace fs = std::filesystem;

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

// Creates dataset `path` (collective) of `type` and shape dims ({} = scalar).
H5Handle create_dataset(hid_t file, const std::string& path, hid_t type,
                        const std::vector<size_t>& dims, WriteFailure& failure) {
  const std::vector<hsize_t> d(dims.begin(), dims.end());
  H5Handle space(d.empty() ? H5Screate(H5S_SCALAR)
                           : H5Screate_simple(int(d.size()), d.data(), nullptr),
                 H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  // No fill values: parallel HDF5 allocates a dataset's storage when it is made and would write
  // its fill value through it at the flush of the metadata. On a disk that fills up there, a
  // rank whose part of that write fails leaves the collective flush early and every rank waits
  // inside HDF5 for ever; the data is written once, by the tiles, where failures are agreed on.
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Handle dset(H5Dcreate2(file, path.c_str(), type, space.get(), lcpl.get(), dcpl.get(),
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
  ckpt::select_tile(file_space.get(), t);
  H5Handle mem = ckpt::memory_space(t);
  const H5FD_mpio_xfer_t mode = ckpt::transfer_mode(c, collective_bytes);
  // Independent: a rank without a tile has nothing to do. Collective: every rank takes part.
  if (t || mode == H5FD_MPIO_COLLECTIVE)
    failure.note(H5Dwrite(dset, H5T_NATIVE_FLOAT, mem.get(), file_space.get(),
                          ckpt::transfer(mode).get(), local) < 0,
                 "write of /" + path + " failed");
  return t ? tile_checksum(layout, *t, local) : 0;
}

// Writes a whole (Rows / Cols) state of n values, where this rank is its one writer (`mine`):
// an independent write. Returns this rank's part of the dataset's checksum.
uint64_t write_whole(hid_t dset, const std::string& path, bool mine, const float* values,
                     size_t n, WriteFailure& failure) {
  if (dset < 0 || !mine) return 0;
  failure.note(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                        ckpt::transfer(H5FD_MPIO_INDEPENDENT).get(), values) < 0,
               "write of /" + path + " failed");
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += element_hash(i, values[i]);
  return sum;
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
std::string reserve_space(const std::string& tmp, uint64_t bytes, bool* reserved) {
  const int fd = open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  std::string why;
  *reserved = fallocate(fd, 0, 0, off_t(bytes)) == 0;
  if (!*reserved) {
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

// Rank 0, while a write that holds no reservation runs: HDF5's collective flushes and writes do
// not survive a write that fails on one rank (that rank leaves the collective early and every
// rank waits inside HDF5 for ever), and a disk can fill up at any moment (another writer on shared
// scratch). When the checkpoint directory's file system stays full (less than 64 KiB free) for
// kAgreeSeconds while the write has not ended, the write cannot end: this thread removes the
// partial file, prints `line` and ends the job (MPI_Abort, exit 1).
class DiskWatch {
 public:
  DiskWatch(bool active, std::string dir, std::function<std::string()> line)
      : dir_(std::move(dir)), line_(std::move(line)) {
    if (active) thread_ = std::thread([this] { watch(); });
  }
  ~DiskWatch() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  DiskWatch(const DiskWatch&) = delete;
  DiskWatch& operator=(const DiskWatch&) = delete;

 private:
  void watch() {
    using Clock = std::chrono::steady_clock;
    std::unique_lock<std::mutex> lock(mutex_);
    Clock::time_point full_since{};
    bool full = false;
    while (!wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return done_; })) {
      const long long free = free_bytes(dir_);
      if (free < 0 || free >= (64 << 10)) {
        full = false;
        continue;
      }
      if (!full) full_since = Clock::now();
      full = true;
      if (Clock::now() - full_since < std::chrono::duration<double>(agree_seconds())) continue;
      abort_with_line(line_(), kExitIO);
    }
  }

  std::string dir_;
  std::function<std::string()> line_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// The root attributes and the /model, /optim, /train and /tokenizer groups. Metadata is made the
// same way on every rank, so it fails (if ever) on all of them alike.
void write_metadata(hid_t root, const LocalLayout& layout, const TrainState& state,
                    const std::string& rule, const std::string& deck_yaml,
                    const TokenizerInfo& tokenizer, const std::string& saved_layout, int rank,
                    WriteFailure& failure) {
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
    // Only with it: the checkpoints of models without q/k norms stay as they were.
    if (s.qk_norm) h5_write_int_attr(model.get(), "qk_norm", 1);
    if (s.moe.experts > 0) {  // a dense model's /model is as it was before MoE
      h5_write_int_attr(model.get(), "moe_experts", s.moe.experts);
      h5_write_int_attr(model.get(), "moe_top_k", s.moe.top_k);
      h5_write_int_attr(model.get(), "moe_ffn", s.moe.ffn);
      h5_write_int_attr(model.get(), "moe_every", s.moe.every);
      h5_write_int_attr(model.get(), "moe_first_dense", s.moe.first_dense);
      // Only with shared experts: the checkpoints of MoE models without them stay as they were.
      if (s.moe.shared > 0) h5_write_int_attr(model.get(), "moe_shared_experts", s.moe.shared);
    }

    if (!rule.empty()) {
      H5Handle optim = make_group(root, "optim", failure);
      h5_write_int_attr(optim.get(), "step", state.optim_step >= 0 ? state.optim_step : state.step);
      h5_write_string_attr(optim.get(), "rule", rule);
    }
    H5Handle train = make_group(root, "train", failure);
    h5_write_int_attr(train.get(), "next_sample", state.next_sample);
    h5_write_int_attr(train.get(), "seed", int64_t(state.seed));
    h5_write_int_attr(train.get(), "vocab_size", s.vocab_size);
    h5_write_double_attr(train.get(), "lr", state.lr);
    h5_write_string_attr(train.get(), "data_sources", state.data_sources);
    h5_write_string_attr(train.get(), "data_position", state.data_position);
    ckpt::write_fp8_history(train.get(), state, rank == 0);
    ckpt::write_moe_bias(train.get(), state, s.moe.experts, rank == 0);
    H5Handle tok = make_group(root, "tokenizer", failure);
    h5_write_string_attr(tok.get(), "type", tokenizer.type);
    h5_write_int_attr(tok.get(), "vocab_size", tokenizer.vocab_size);
    h5_write_int_attr(tok.get(), "eot", tokenizer.eot);
    // The sentencepiece model, copied from the token file: `tessera sample` decodes with it.
    write_tokenizer_model(tok.get(), "model", tokenizer.model, rank == 0,
                          ckpt::transfer(H5FD_MPIO_INDEPENDENT).get());
  } catch (const std::exception& e) {
    failure.note(true, e.what());
  }
}

// This rank's first weight or optimizer state value that is not finite, as first_bad_value names
// it; "" when there is none.
std::string first_bad_tile_value(const LocalLayout& layout, const ModelBuffers& buffers) {
  std::string bad;
  for (size_t i = 0; i < layout.tensors.size() && bad.empty(); ++i) {
    const LocalTensor& t = layout.tensors[i];
    const ParamTensor& c = layout.canonical.tensors[t.canonical];
    if (buffers.params) bad = first_bad_value("/model/" + c.name, buffers.params + t.offset,
                                              t.numel, false);
    for (const StateBuffer& b : buffers.state) {
      if (!bad.empty() || !b.spec.holds(c)) continue;
      const size_t at = state_host_layout(b.spec, layout, 0).offset[i];
      bad = first_bad_value("/optim/" + b.spec.name + "/" + c.name,
                            b.data + (b.spec.whole() ? at : t.offset),
                            b.spec.whole() ? b.spec.numel(c) : t.numel, false);
    }
  }
  return bad;
}

// A checkpoint's datasets, tensor by tensor (ckpt::tensor_datasets: the weights, then each state
// of the tensor): `first[i]` is canonical tensor i's first. Each dataset has a scalar checksum
// dataset beside it.
struct Datasets {
  std::vector<ckpt::TensorDataset> sets;
  std::vector<size_t> first;
  std::vector<H5Handle> tensors, checksums;
};

// Creates (collective) every tensor's dataset, then every checksum's.
Datasets create_datasets(hid_t root, const LocalLayout& layout, const ModelBuffers& buffers,
                         WriteFailure& failure) {
  Datasets out;
  std::vector<StateSpec> specs;
  for (const StateBuffer& b : buffers.state) specs.push_back(b.spec);
  for (const ParamTensor& c : layout.canonical.tensors) {
    out.first.push_back(out.sets.size());
    for (ckpt::TensorDataset& d : ckpt::tensor_datasets(c, specs)) {
      out.tensors.push_back(create_dataset(root, d.path, H5T_IEEE_F32LE, d.shape, failure));
      out.sets.push_back(std::move(d));
    }
  }
  out.first.push_back(out.sets.size());
  for (const ckpt::TensorDataset& d : out.sets)
    out.checksums.push_back(create_dataset(root, "checksum/" + d.path, H5T_STD_U64LE, {}, failure));
  return out;
}

// Writes this rank's tiles of every tensor it owns (collective), appending its part of each
// dataset's checksum to sums. A write that failed on one rank stops every rank after that
// tensor, before the next collective call. Returns the failure, the same on every rank.
template <class Agree>
std::string write_data(const Agree& agree, const LocalLayout& layout, bool writer,
                       const ModelBuffers& buffers, const Datasets& sets, long collective_bytes,
                       WriteFailure& local, std::vector<uint64_t>& sums) {
  const std::vector<const LocalTensor*> tiles = ckpt::tiles_by_canonical(layout);
  std::vector<StateHostLayout> at;
  for (const StateBuffer& b : buffers.state) at.push_back(state_host_layout(b.spec, layout, 0));
  std::string failure;
  for (size_t i = 0; i < tiles.size() && failure.empty(); ++i) {
    const ParamTensor& c = layout.canonical.tensors[i];
    // Replicated copies (other dp ranks, other tp ranks, the tied wte copy) stay silent.
    const LocalTensor* t = writer && tiles[i] && tiles[i]->owner ? tiles[i] : nullptr;
    const size_t off = t ? t->offset : 0;
    for (size_t d = sets.first[i]; d < sets.first[i + 1]; ++d) {
      const ckpt::TensorDataset& set = sets.sets[d];
      if (set.state < 0) {
        sums.push_back(write_tensor(sets.tensors[d].get(), set.path, layout, c, t,
                                    buffers.params + off, collective_bytes, local));
        continue;
      }
      const StateBuffer& b = buffers.state[size_t(set.state)];
      if (b.spec.whole()) {
        const size_t j = size_t(t ? t - layout.tensors.data() : 0);
        sums.push_back(write_whole(sets.tensors[d].get(), set.path, ckpt::holds_first_element(t),
                                   t ? b.data + at[size_t(set.state)].offset[j] : nullptr,
                                   b.spec.numel(c), local));
      } else {
        sums.push_back(write_tensor(sets.tensors[d].get(), set.path, layout, c, t, b.data + off,
                                    collective_bytes, local));
      }
    }
    failure = agree(local.what);
  }
  return failure;
}

// One reduction for all checksums: each is the sum of the owners' parts. Rank 0 writes them.
void write_checksums(MPI_Comm comm, int rank, const Datasets& sets, std::vector<uint64_t>& sums,
                     WriteFailure& failure) {
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_SUM, comm);
  for (size_t d = 0; d < sums.size() && rank == 0; ++d)
    failure.note(H5Dwrite(sets.checksums[d].get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL,
                          ckpt::transfer(H5FD_MPIO_INDEPENDENT).get(), &sums[d]) < 0,
                 "cannot write /checksum/" + sets.sets[d].path);
}

}  // namespace

uint64_t checkpoint_bytes(const LocalLayout& layout, const TokenizerInfo& tokenizer,
                          size_t text_bytes) {
  return checkpoint_bytes(layout, rule_state_names("adamw"), tokenizer, text_bytes);
}

uint64_t checkpoint_bytes(const LocalLayout& layout, const std::vector<StateSpec>& state,
                          const TokenizerInfo& tokenizer, size_t text_bytes) {
  uint64_t values = 0, datasets = 0;  // datasets: each with its checksum
  for (const ParamTensor& c : layout.canonical.tensors)
    for (const ckpt::TensorDataset& d : ckpt::tensor_datasets(c, state)) {
      uint64_t n = 1;
      for (size_t x : d.shape) n *= x;
      values += n;
      datasets += 2;
    }
  return values * sizeof(float) + datasets * (8 + 1024) + tokenizer.model.size() +
         2 * text_bytes + (256 << 10);
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
  const std::string room_path = (fs::path(dir) / kRoomFile).string();
  // What a write that fails leaves: the partial file, and the room held for its metadata.
  const auto remove_partial = [&] {
    unlink(tmp_path.c_str());
    unlink(room_path.c_str());
  };
  std::vector<StateSpec> specs;
  for (const StateBuffer& b : buffers.state) specs.push_back(b.spec);
  const uint64_t bytes =
      checkpoint_bytes(layout, specs, tokenizer,
                       deck_yaml.size() + state.data_sources.size() + state.data_position.size());
  // The one line of a failure, "kept" naming what stays the newest checkpoint.
  const auto line = [&](const std::string& why, const std::string& keep) {
    const std::string where = "checkpoint step " + std::to_string(state.step) + ": ";
    if (!no_space(why)) return where + why + ": " + keep;
    const long long free = free_bytes(dir);
    return where + "disk full on " + dir + " (a checkpoint needs about " +
           human_bytes(double(bytes)) +
           (free >= 0 ? ", " + human_bytes(double(free)) + " are free" : "") + "): " + keep;
  };
  // A rank that failed and finds a peer stuck (inside HDF5's own collectives) past the agreement's
  // deadline removes the partial file and ends the job with its line (agree_on_failure).
  const auto agree = [&](const std::string& failure) {
    return agree_on_failure(comm, failure, [&](const std::string& why) {
      remove_partial();
      return line(why, kept(dir));
    }, kExitIO);
  };
  // Every failure ends here, on every rank at once: the tmp file removed, `latest` untouched.
  auto give_up = [&](const std::string& why) {
    std::string keep = rank == 0 ? kept(dir) : "";
    keep = agree_on_failure(comm, keep);
    if (rank == 0) unlink(tmp_path.c_str());
    throw UserError(line(why, keep), kExitIO);
  };

  // HDF5 cannot close a file whose metadata it cannot write (and then fails inside MPI_Finalize),
  // so the metadata must always find room: there must be room for it before the file is made,
  // and it is written, and flushed, before any data.
  const uint64_t metadata_bytes =
      2 * (1 + specs.size()) * layout.canonical.tensors.size() * 1024 + (64 << 10);
  std::string failure;
  if (rank == 0) {
    failure = make_directories(dir);
    const long long free = failure.empty() ? free_bytes(dir) : -1;
    if (free >= 0 && uint64_t(free) < 2 * metadata_bytes)  // the metadata, and room held for it
      failure = "cannot write " + tmp_path + ": " + std::strerror(ENOSPC);
  }
  if (std::string why = agree(failure); !why.empty()) give_up(why);
  // Never a checkpoint of weights or moments that are not finite: it would poison every restart.
  if (std::string bad = agree_on_failure(comm, first_bad_tile_value(layout, buffers)); !bad.empty())
    throw UserError("checkpoint step " + std::to_string(state.step) + ": refused: " + bad +
                        ": nothing written, " + (rank == 0 ? kept(dir) : std::string("")),
                    kExitAnomaly);

  WriteFailure local;
  const IoErrorWatch io_watch(  // a write error one rank alone sees (io/io_error_watch.hpp)
      tmp_path, remove_partial,
      [&](const std::string& why) {
        return "checkpoint step " + std::to_string(state.step) + ": " + why + ": " + kept(dir);
      });
  H5Handle file(H5Fcreate(mpiio_name(tmp_path).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT,
                          parallel_access(comm).get()),
                H5Fclose);
  local.note(!file.valid(), "cannot create " + tmp_path);
  if (void* handle = nullptr; file.valid() && H5Fget_vfd_handle(file.get(), H5P_DEFAULT, &handle) >= 0)
    IoErrorWatch::attach(*static_cast<MPI_File*>(handle));
  if (std::string why = agree(local.what); !why.empty()) give_up(why);
  bool reserved = false;
  if (rank == 0 && reserve) local.what = reserve_space(tmp_path, bytes, &reserved);
  failure = agree(local.what);
  const DiskWatch watch(rank == 0 && !reserved, dir, [&] {
    remove_partial();
    return line("cannot write " + tmp_path + ": " + std::strerror(ENOSPC) +
                    " (the disk stayed full)",
                kept(dir));
  });
  {
    // 1. Every object: attributes, groups, the tensors' and the checksums' datasets; flushed.
    const hid_t root = file.get();
    Datasets sets;
    if (failure.empty()) {
      write_metadata(root, layout, state, buffers.rule, deck_yaml, tokenizer, saved_layout, rank,
                     local);
      sets = create_datasets(root, layout, buffers, local);
      local.note(H5Fflush(root, H5F_SCOPE_GLOBAL) < 0, "flush of " + tmp_path + " failed");
      if (rank == 0 && local.what.empty()) local.what = hold_room(room_path, metadata_bytes);
      failure = agree(local.what);
    }
    // 2. The data, tensor by tensor.
    std::vector<uint64_t> sums;
    if (failure.empty())
      failure = write_data(agree, layout, writer, buffers, sets, collective_bytes, local, sums);
    // The metadata's room back to the disk, before HDF5 writes metadata again (the flush below,
    // or the close).
    if (rank == 0) unlink(room_path.c_str());
    // 3. The checksums; flushed.
    if (failure.empty()) {
      write_checksums(comm, rank, sets, sums, local);
      local.note(H5Fflush(root, H5F_SCOPE_GLOBAL) < 0, "flush of " + tmp_path + " failed");
      failure = agree(local.what);
    }
    // A failure leaves the metadata written: what the close still writes is small. Give it the
    // space the partial file took (the data written so far) first.
    if (!failure.empty() && rank == 0) truncate(tmp_path.c_str(), 0);
    MPI_Barrier(comm);
  }  // the datasets close here, the file below
  // One close: a close that failed cannot be retried (HDF5 1.10 leaves the file half torn down).
  if (H5Fclose(file.release()) < 0) {
    // HDF5 still holds the file and would close it again inside MPI_Finalize, after MPI is gone:
    // this rank ends the job instead (MPI_Abort), the partial file removed.
    remove_partial();
    throw UserError("checkpoint step " + std::to_string(state.step) + ": " +
                        (failure.empty() ? "" : failure + ", and ") + "the close of " + tmp_path +
                        " failed: " + h5_error_reason() + ": " + kept(dir),
                    kExitIO, /*every_rank=*/false);
  }
  if (!failure.empty()) give_up(failure);

  if (rank == 0) {
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      failure = "cannot rename " + tmp_path + " to " + final_path + ": " + std::strerror(errno);
    else
      failure = write_file_atomically((fs::path(dir) / "latest").string(),
                                      step_name(state.step) + "\n", /*durable=*/true);
  }
  failure = agree(failure);
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

}  // namespace tessera
