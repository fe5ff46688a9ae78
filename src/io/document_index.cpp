#include "io/document_index.hpp"

#include "common/error.hpp"
#include "io/hdf5_util.hpp"

namespace tessera {

std::vector<uint64_t> read_document_offsets(const std::string& path, uint64_t num_tokens,
                                            int64_t num_documents) {
  const std::lock_guard<std::mutex> lock(hdf5_mutex());
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid())
    throw UserError("cannot open token file " + path + ": " + h5_error_reason(), kExitIO);
  if (H5Lexists(file.get(), "document_offsets", H5P_DEFAULT) <= 0)
    throw UserError(path + ": no document index /document_offsets, which data.windows: documents "
                    "reads (files of tessera data prepare and tools/data/prepare_data.py have one; "
                    "prepare this one again)");
  const std::string where = path + ": /document_offsets";
  H5Handle set(H5Dopen2(file.get(), "document_offsets", H5P_DEFAULT), H5Dclose);
  if (!set.valid()) throw UserError(where + " cannot be opened: " + h5_error_reason());
  H5Handle type(H5Dget_type(set.get()), H5Tclose), space(H5Dget_space(set.get()), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_ndims(space.get()) != 1)
    throw UserError(where + " must be a 1-D integer dataset");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  if (n < 1 || (num_documents >= 0 && n != hsize_t(num_documents) + 1))
    throw UserError(where + " has " + std::to_string(n) + " entries; num_documents " +
                    std::to_string(num_documents) + " needs one more");
  std::vector<int64_t> raw(n);
  if (H5Dread(set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
    throw UserError(where + " cannot be read: " + h5_error_reason(), kExitIO);
  if (raw.front() != 0 || uint64_t(raw.back()) != num_tokens)
    throw UserError(where + " runs from " + std::to_string(raw.front()) + " to " +
                    std::to_string(raw.back()) + "; the " + std::to_string(num_tokens) +
                    " tokens need 0 to " + std::to_string(num_tokens));
  std::vector<uint64_t> offsets(n);
  for (size_t d = 0; d < n; ++d) {
    if (d > 0 && raw[d] < raw[d - 1])
      throw UserError(where + "[" + std::to_string(d) + "] = " + std::to_string(raw[d]) +
                      " is before the entry ahead of it (" + std::to_string(raw[d - 1]) + ")");
    offsets[d] = uint64_t(raw[d]);
  }
  return offsets;
}

}  // namespace tessera
