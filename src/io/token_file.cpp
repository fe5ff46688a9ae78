#include "io/token_file.hpp"

#include <sys/stat.h>

#include <vector>

#include "common/error.hpp"
#include "common/files.hpp"
#include "common/limits.hpp"
#include "io/contained.hpp"

namespace tessera {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

// The name of the file an HDF5 object lives in (another file's, through an external link).
std::string file_name_of(hid_t object) {
  const ssize_t n = H5Fget_name(object, nullptr, 0);
  if (n <= 0) return "";
  std::vector<char> name(size_t(n) + 1, '\0');
  H5Fget_name(object, name.data(), name.size());
  return name.data();
}

uint64_t size_on_disk(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

}  // namespace

TokenFile::TokenFile(const std::string& path, bool contained) : path_(path) {
  hdf5_quiet();
  require_regular_file(path, "token file");
  if (contained)
    run_contained("token file " + path, [&] {
      TokenFile probe(path, false);
      uint32_t token = 0;
      if (probe.num_tokens_ > 0) {
        probe.read(0, 1, &token);
        probe.read(probe.num_tokens_ - 1, 1, &token);
      }
    });
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw UserError(path + ": not an HDF5 token file (make one with tools/data/prepare_data.py)");
  file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid())
    throw UserError("cannot open token file " + path + ": " + h5_error_reason(), kExitIO);
  if (H5Lexists(file_.get(), "tokens", H5P_DEFAULT) <= 0)
    throw UserError(path + ": no /tokens dataset (make one with tools/data/prepare_data.py)");
  dataset_ = H5Handle(H5Dopen2(file_.get(), "tokens", H5P_DEFAULT), H5Dclose);
  if (!dataset_.valid())
    throw UserError(path + ": /tokens cannot be opened: " + h5_error_reason());
  // An external link puts /tokens in another file: its offset is not an offset of this one.
  if (const std::string home = file_name_of(dataset_.get()); home != file_name_of(file_.get()))
    throw UserError(path + ": /tokens is a link to a dataset in another file, " + home +
                    "; give that file as the data");
  H5Handle type(H5Dget_type(dataset_.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
      (H5Tget_size(type.get()) != 2 && H5Tget_size(type.get()) != 4))
    throw UserError(path + ": /tokens must be uint16 or uint32");
  file_space_ = H5Handle(H5Dget_space(dataset_.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(file_space_.get()) != 1)
    throw UserError(path + ": /tokens must be one-dimensional");
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(file_space_.get(), dims, nullptr);
  num_tokens_ = dims[0];
  token_bytes_ = int(H5Tget_size(type.get()));
  num_documents_ = h5_read_int_attr(file_.get(), "num_documents").value_or(-1);
  if (h5_has_attr(file_.get(), "num_documents") && num_documents_ < 0)
    throw UserError(path + ": num_documents attribute " + std::to_string(num_documents_) +
                    " is negative");
  file_bytes_ = size_on_disk(path);
  check_storage(type.get());
  if (auto v = h5_read_string_attr(file_.get(), "tokenizer")) tokenizer_.type = *v;
  if (auto v = h5_read_int_attr(file_.get(), "vocab_size")) tokenizer_.vocab_size = *v;
  if (auto v = h5_read_int_attr(file_.get(), "eot")) tokenizer_.eot = *v;
  if (tokenizer_.vocab_size <= 0 || tokenizer_.vocab_size > limits::kVocab)
    throw UserError(path + ": the vocab_size attribute on the root group must be from 1 to " +
                    std::to_string(limits::kVocab) + " (" + limits::kVocabWhy + "), got " +
                    (h5_has_attr(file_.get(), "vocab_size")
                         ? std::to_string(tokenizer_.vocab_size)
                         : std::string("none")));
  if (h5_has_attr(file_.get(), "eot") && tokenizer_.eot < 0)
    throw UserError(path + ": the eot attribute is " + std::to_string(tokenizer_.eot) +
                    ", not an id of the vocabulary");
  tokenizer_.model = read_tokenizer_model(file_.get(), path, "tokenizer_model");
  check_tokenizer(tokenizer_, path);
}

// What the dataset's storage really holds. A dataset whose data was never written, or a file cut
// short, reads as zeros (HDF5's fill value, or its reads past the end of the file) and would
// train on them without a word: refused here. A contiguous little-endian dataset stored in the
// file is read by offset (the loader's fast path); chunked and compact ones through HDF5.
void TokenFile::check_storage(hid_t type) {
  H5Handle plist(H5Dget_create_plist(dataset_.get()), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(plist.get());
  if (layout == H5D_VIRTUAL)
    throw UserError(path_ + ": /tokens is a virtual dataset (its data lives in other files, and "
                    "missing parts read as zeros); store the tokens in the file (h5repack -l CONTI)");
  if (H5Pget_external_count(plist.get()) > 0)
    throw UserError(path_ + ": /tokens keeps its data in external raw files; store the tokens in "
                    "the file (h5repack -l CONTI)");
  if (layout == H5D_CHUNKED) {
    // Every chunk written (HDF5's space status counts bytes, which a partial last chunk skews).
    hsize_t chunk = 1, written = 0;
    H5Pget_chunk(plist.get(), 1, &chunk);
    H5Handle all(H5Dget_space(dataset_.get()), H5Sclose);
    H5Sselect_all(all.get());
    H5Dget_num_chunks(dataset_.get(), all.get(), &written);
    const hsize_t chunks = (num_tokens_ + chunk - 1) / chunk;
    if (written < chunks)
      throw UserError(path_ + ": /tokens declares " + num(num_tokens_) + " tokens in " +
                      num(chunks) + " chunks, but only " + num(written) +
                      " were ever written (the rest would read as zeros)");
    // Unfiltered chunks are stored whole; one recorded smaller than that makes libhdf5 1.10
    // copy a whole chunk out of its shorter buffer (found by fuzzing: a chunk of size 0).
    const uint64_t stored = H5Dget_storage_size(dataset_.get());
    const uint64_t whole = uint64_t(written) * chunk * uint64_t(token_bytes_);
    if (H5Pget_nfilters(plist.get()) == 0 && stored != whole)
      throw UserError(path_ + ": /tokens' " + num(written) + " unfiltered chunks of " +
                      num(chunk) + " tokens take " + num(stored) + " bytes on disk, not " +
                      num(whole) + " (a damaged chunk index)");
    return;  // read through HDF5
  }
  H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
  H5Dget_space_status(dataset_.get(), &status);
  if (num_tokens_ > 0 && status != H5D_SPACE_STATUS_ALLOCATED)
    throw UserError(path_ + ": /tokens declares " + num(num_tokens_) +
                    " tokens, but its data was never written (it would read as zeros)");
  const haddr_t offset = H5Dget_offset(dataset_.get());
  if (layout != H5D_CONTIGUOUS || offset == HADDR_UNDEF) return;
  const uint64_t end = uint64_t(offset) + num_tokens_ * uint64_t(token_bytes_);
  if (end > file_bytes_)
    throw UserError(path_ + ": /tokens declares " + num(num_tokens_) + " tokens at bytes " +
                    num(offset) + ".." + num(end) + ", but the file ends at byte " +
                    num(file_bytes_) + " (truncated)");
  if (H5Pget_nfilters(plist.get()) == 0 && H5Tget_order(type) == H5T_ORDER_LE)
    contiguous_offset_ = int64_t(offset);
}

void TokenFile::read(uint64_t first, uint64_t count, uint32_t* out) {
  if (count == 0) return;
  const std::lock_guard<std::mutex> lock(hdf5_mutex());  // a background checkpoint write may run
  const hsize_t start[1] = {first};
  const hsize_t n[1] = {count};
  H5Sselect_hyperslab(file_space_.get(), H5S_SELECT_SET, start, nullptr, n, nullptr);
  H5Handle mem(H5Screate_simple(1, n, nullptr), H5Sclose);
  if (H5Dread(dataset_.get(), H5T_NATIVE_UINT32, mem.get(), file_space_.get(), H5P_DEFAULT, out) < 0)
    throw UserError(path_ + ": read of /tokens failed at token " + std::to_string(first) + ": " +
                        h5_error_reason(),
                    kExitIO, false);
  // HDF5 reads past the end of a file as zeros: a file truncated since it was opened (another
  // job rewriting it) must stop the run, not feed it zeros. A read before the truncation is
  // sound; every read after it sees the new size here.
  if (const uint64_t now = size_on_disk(path_); now < file_bytes_)
    throw UserError(path_ + ": the file shrank from " + num(file_bytes_) + " to " + num(now) +
                        " bytes while it was being read (truncated or rewritten by another job?)",
                    kExitIO, false);
}

}  // namespace tessera
