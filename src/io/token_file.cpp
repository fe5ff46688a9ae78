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
  token_bytes_ = int(H5Tget_size(type.get()));
  num_documents_ = h5_read_int_attr(file_.get(), "num_documents").value_or(-1);
  {
    H5Handle plist(H5Dget_create_plist(dataset_.get()), H5Pclose);
    const haddr_t offset = H5Dget_offset(dataset_.get());
    if (H5Pget_layout(plist.get()) == H5D_CONTIGUOUS && H5Pget_nfilters(plist.get()) == 0 &&
        H5Tget_order(type.get()) == H5T_ORDER_LE && offset != HADDR_UNDEF)
      contiguous_offset_ = int64_t(offset);
  }
  if (auto v = h5_read_string_attr(file_.get(), "tokenizer")) tokenizer_.type = *v;
  if (auto v = h5_read_int_attr(file_.get(), "vocab_size")) tokenizer_.vocab_size = *v;
  if (auto v = h5_read_int_attr(file_.get(), "eot")) tokenizer_.eot = *v;
  if (tokenizer_.vocab_size <= 0)
    throw UserError(path + ": missing or bad vocab_size attribute on the root group");
  tokenizer_.model = read_tokenizer_model(file_.get(), path, "tokenizer_model");
  check_tokenizer(tokenizer_, path);
}

void TokenFile::read(uint64_t first, uint64_t count, uint32_t* out) {
  if (count == 0) return;
  const hsize_t start[1] = {first};
  const hsize_t n[1] = {count};
  H5Sselect_hyperslab(file_space_.get(), H5S_SELECT_SET, start, nullptr, n, nullptr);
  H5Handle mem(H5Screate_simple(1, n, nullptr), H5Sclose);
  if (H5Dread(dataset_.get(), H5T_NATIVE_UINT32, mem.get(), file_space_.get(), H5P_DEFAULT, out) < 0)
    throw UserError(path_ + ": read of /tokens failed at token " + std::to_string(first), kExitIO,
                    false);
}

}  // namespace tessera
