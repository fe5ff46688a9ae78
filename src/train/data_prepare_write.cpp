#include "train/data_prepare_write.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_util.hpp"
#include "io/io_error_watch.hpp"

namespace tessera {

namespace {

constexpr hsize_t kAlign = 4096;                 // as tools/data/prepare_data.py's ALIGN
constexpr int64_t kRoundBytes = int64_t(256) << 20;  // per rank per collective write (MPI-IO
                                                 // counts are int: stay far below 2 GiB)

struct Failure {
  std::string what;
  void note(bool failed, const std::string& doing) {
    if (failed && what.empty()) what = doing + ": " + h5_error_reason();
  }
};

// As h5py writes np.bytes_: fixed-length, NUL-padded, ASCII, exactly the characters.
void string_attr(hid_t obj, const char* name, const std::string& value, Failure* failure) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(value.size(), 1));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  failure->note(!attr.valid() || H5Awrite(attr.get(), type.get(), value.data()) < 0,
                std::string("attribute ") + name);
}

void int_attr(hid_t obj, const char* name, int64_t value, Failure* failure) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  failure->note(!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0,
                std::string("attribute ") + name);
}

H5Handle create_dataset(hid_t file, const char* name, hid_t type, hsize_t n, Failure* failure) {
  H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);  // the loader reads the raw bytes in place
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Pset_obj_track_times(dcpl.get(), false);  // the same inputs give the same file
  H5Handle dset(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                H5Dclose);
  failure->note(!dset.valid(), std::string("create /") + name);
  return dset;
}

// Fills out with elements [at, at + count) of this rank's part of a dataset.
using Fill = std::function<void(int64_t at, int64_t count, char* out)>;

// Every rank makes `rounds` collective writes of at most kRoundBytes, elements [at, at + n) of
// its part each time, staged by fill (an empty selection once its part is written); `extra`
// (the final /document_offsets entry, on rank 0) goes with the first round.
void write_rounds(MPI_Comm comm, hid_t dset, hid_t mem_type, size_t elem_bytes, const Fill& fill,
                  int64_t n, int64_t file_offset, const int64_t* extra, int64_t extra_at,
                  Failure* failure) {
  const int64_t per_round = std::max<int64_t>(1, kRoundBytes / int64_t(elem_bytes));
  int64_t rounds = (n + per_round - 1) / per_round + (extra && n == 0 ? 1 : 0);
  MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT64_T, MPI_MAX, comm);
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  std::vector<char> staged;
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t at = std::min(n, r * per_round), count = std::min(n - at, per_round);
    const bool with_extra = extra && r == 0;
    H5Handle file_space(H5Dget_space(dset), H5Sclose);
    H5Sselect_none(file_space.get());
    if (count > 0) {
      const hsize_t start = hsize_t(file_offset + at), len = hsize_t(count);
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &len, nullptr);
    }
    staged.resize(size_t(count + (with_extra ? 1 : 0)) * elem_bytes);
    if (count > 0) fill(at, count, staged.data());
    if (with_extra) {
      const hsize_t start = hsize_t(extra_at), len = 1;
      H5Sselect_hyperslab(file_space.get(), count > 0 ? H5S_SELECT_OR : H5S_SELECT_SET, &start,
                          nullptr, &len, nullptr);
      std::memcpy(staged.data() + size_t(count) * elem_bytes, extra, elem_bytes);
    }
    const hsize_t mem_n = std::max<hsize_t>(1, staged.size() / elem_bytes);
    H5Handle mem_space(H5Screate_simple(1, &mem_n, nullptr), H5Sclose);
    if (staged.empty()) H5Sselect_none(mem_space.get());
    failure->note(H5Dwrite(dset, mem_type, mem_space.get(), file_space.get(), dxpl.get(),
                           staged.empty() ? static_cast<const void*>(&mem_n) : staged.data()) < 0,
                  "collective write");
  }
}

// Fill for /tokens: the documents' tokens one after another, in the file's width. Rounds ask for
// consecutive elements, so a cursor walks the documents once.
template <typename T>
Fill token_fill(const TokenFileShare& share) {
  return [&share, d = size_t(0), in_doc = int64_t(0)](int64_t, int64_t count, char* out) mutable {
    T* to = reinterpret_cast<T*>(out);
    const uint32_t* tokens = share.tokens->data();
    while (count > 0) {
      const auto [begin, end] = share.documents[d];
      const int64_t take = std::min(count, end - begin - in_doc);
      for (int64_t i = 0; i < take; ++i) *to++ = T(tokens[begin + in_doc + i]);
      count -= take;
      in_doc += take;
      if (begin + in_doc == end) ++d, in_doc = 0;
    }
  };
}

}  // namespace

std::string write_token_file(MPI_Comm comm, const std::string& tmp_path, const TokenizerInfo& tok,
                             const TokenFileShare& share) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Failure failure;
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Pset_all_coll_metadata_ops(fapl.get(), true);
  H5Pset_coll_metadata_write(fapl.get(), true);
  H5Pset_alignment(fapl.get(), 1, kAlign);
  H5Handle file(H5Fcreate(mpiio_name(tmp_path).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                H5Fclose);
  if (!file.valid())
    return "cannot create " + tmp_path + " through MPI-IO (is the directory on a file system "
           "MPI-IO can write, and writable?): " + h5_error_reason();
  // A write error of one rank alone leaves the ranks in different HDF5 collectives, where none
  // returns: the watch then removes the partial file and ends the job with one line.
  const IoErrorWatch io_watch(
      tmp_path, [&tmp_path] { unlink(tmp_path.c_str()); },
      [&tmp_path](const std::string& why) {
        return "tessera data prepare: " + why + ": " + tmp_path + " removed, no file written";
      });
  if (void* handle = nullptr; H5Fget_vfd_handle(file.get(), H5P_DEFAULT, &handle) >= 0)
    IoErrorWatch::attach(*static_cast<MPI_File*>(handle));
  const hid_t root = file.get();
  string_attr(root, "format", "tessera-tokens", &failure);
  int_attr(root, "format_version", 1, &failure);
  string_attr(root, "tokenizer", tok.type, &failure);
  int_attr(root, "vocab_size", tok.vocab_size, &failure);
  int_attr(root, "eot", tok.eot, &failure);
  int_attr(root, "num_documents", share.num_documents, &failure);

  const bool wide = tok.vocab_size > 65536;
  {
    H5Handle tokens = create_dataset(root, "tokens", wide ? H5T_STD_U32LE : H5T_STD_U16LE,
                                     hsize_t(share.num_tokens), &failure);
    if (tokens.valid())
      write_rounds(comm, tokens.get(), wide ? H5T_NATIVE_UINT32 : H5T_NATIVE_UINT16, wide ? 4 : 2,
                   wide ? token_fill<uint32_t>(share) : token_fill<uint16_t>(share),
                   share.local_tokens, share.first_token, nullptr, 0, &failure);
  }
  {
    H5Handle offsets = create_dataset(root, "document_offsets", H5T_STD_I64LE,
                                      hsize_t(share.num_documents + 1), &failure);
    // Entry d: where document d starts in /tokens, from this rank's offset and its lengths.
    std::vector<int64_t> starts(share.documents.size());
    for (size_t d = 0, at = size_t(share.first_token); d < starts.size(); ++d) {
      starts[d] = int64_t(at);
      at += size_t(share.documents[d].second - share.documents[d].first);
    }
    const Fill fill = [&starts](int64_t at, int64_t count, char* out) {
      std::memcpy(out, starts.data() + at, size_t(count) * sizeof(int64_t));
    };
    const int64_t end = share.num_tokens;
    if (offsets.valid())
      write_rounds(comm, offsets.get(), H5T_NATIVE_INT64, 8, fill, int64_t(starts.size()),
                   share.first_document, rank == 0 ? &end : nullptr, share.num_documents, &failure);
  }
  if (!tok.model.empty()) {
    H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT);
    try {
      write_tokenizer_model(root, "tokenizer_model", tok.model, rank == 0, dxpl.get());
    } catch (const UserError& e) {
      if (failure.what.empty()) failure.what = e.what();
    }
  }
  failure.note(H5Fclose(file.release()) < 0, "close of " + tmp_path);
  return failure.what.empty() ? "" : tmp_path + ": " + failure.what;
}

}  // namespace tessera
