#include "io/token_file.hpp"

#include <unistd.h>

#include "common/error.hpp"

namespace tessera {

TokenFile::TokenFile(const std::string& path) : path_(path) {
  hdf5_quiet();
  if (access(path.c_str(), R_OK) != 0)
    throw UserError("cannot read token file " + path + ": no such file or not readable", kExitIO);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw UserError(path + ": not an HDF5 token file (make one with tools/prepare_data.py)");
  file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) throw UserError("cannot open token file " + path, kExitIO);
  if (H5Lexists(file_.get(), "tokens", H5P_DEFAULT) <= 0)
    throw UserError(path + ": no /tokens dataset (make one with tools/prepare_data.py)");
  dataset_ = H5Handle(H5Dopen2(file_.get(), "tokens", H5P_DEFAULT), H5Dclose);
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
  if (auto v = h5_read_string_attr(file_.get(), "tokenizer")) tokenizer_.type = *v;
  if (auto v = h5_read_int_attr(file_.get(), "vocab_size")) tokenizer_.vocab_size = *v;
  if (auto v = h5_read_int_attr(file_.get(), "eot")) tokenizer_.eot = *v;
  if (tokenizer_.vocab_size <= 0)
    throw UserError(path + ": missing or bad vocab_size attribute on the root group");
}

void TokenFile::read_window(uint64_t w, int seq_len, int vocab_size, int32_t* inputs,
                            int32_t* targets) {
  const hsize_t start[1] = {w * uint64_t(seq_len)};
  const hsize_t count[1] = {hsize_t(seq_len) + 1};
  if (start[0] + count[0] > num_tokens_)
    throw UserError(path_ + ": window " + std::to_string(w) + " runs past the end of /tokens",
                    kExitBadInput, false);
  buffer_.resize(count[0]);
  H5Sselect_hyperslab(file_space_.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  H5Handle mem(H5Screate_simple(1, count, nullptr), H5Sclose);
  if (H5Dread(dataset_.get(), H5T_NATIVE_UINT32, mem.get(), file_space_.get(), H5P_DEFAULT,
              buffer_.data()) < 0)
    throw UserError(path_ + ": read of /tokens failed at token " + std::to_string(start[0]),
                    kExitIO, false);
  for (size_t i = 0; i < buffer_.size(); ++i) {
    if (buffer_[i] >= uint32_t(vocab_size))
      throw UserError(path_ + ": token " + std::to_string(start[0] + i) + " has id " +
                      std::to_string(buffer_[i]) + ", not below the model's vocab_size " +
                      std::to_string(vocab_size),
                      kExitBadInput, false);
  }
  for (int t = 0; t < seq_len; ++t) {
    inputs[t] = int32_t(buffer_[t]);
    targets[t] = int32_t(buffer_[t + 1]);
  }
}

}  // namespace tessera
