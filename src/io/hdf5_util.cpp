#include "io/hdf5_util.hpp"

#include <stdexcept>
#include <vector>

#include "common/error.hpp"

namespace tessera {

std::mutex& hdf5_mutex() {
  static std::mutex mutex;
  return mutex;
}

void hdf5_quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void hdf5_no_atexit() { H5dont_atexit(); }

namespace {
// The innermost error's description, and the system error message any entry quotes.
struct Reason {
  std::string innermost, system;
};

herr_t collect(unsigned n, const H5E_error2_t* e, void* data) {
  auto* r = static_cast<Reason*>(data);
  const std::string desc = e->desc ? e->desc : "";
  if (n == 0) r->innermost = desc;
  // The sec2 driver: "..., errno = 13, error message = 'Permission denied', ..."
  const std::string key = "error message = '";
  if (const size_t at = desc.find(key); r->system.empty() && at != std::string::npos) {
    const size_t end = desc.find('\'', at + key.size());
    r->system = desc.substr(at + key.size(), end == std::string::npos ? end : end - at - key.size());
  }
  // MPI-IO: "MPI_File_write_at_all failed ... No space left on device"-like texts.
  for (const char* what : {"No space left on device", "Disk quota exceeded", "Permission denied",
                           "Read-only file system", "File exists", "No such file or directory"})
    if (r->system.empty() && desc.find(what) != std::string::npos) r->system = what;
  return 0;
}
}  // namespace

std::string h5_error_reason() {
  Reason r;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &r);
  H5Eclear2(H5E_DEFAULT);
  std::string out = !r.system.empty() ? r.system : r.innermost;
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out.empty() ? "HDF5 gives no reason" : out;
}

bool h5_has_attr(hid_t obj, const std::string& name) {
  return H5Aexists(obj, name.c_str()) > 0;
}

std::optional<std::string> h5_read_string_attr(hid_t obj, const std::string& name) {
  if (!h5_has_attr(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* text = nullptr;
    if (H5Aread(attr.get(), mem.get(), &text) < 0 || text == nullptr) return std::nullopt;
    std::string out(text);
    H5free_memory(text);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  // A text attribute (a deck, a data description) is a few KB; a damaged or crafted file may
  // declare gigabytes.
  if (size > (size_t(64) << 20))
    throw UserError("attribute " + name + " declares " + std::to_string(size) +
                    " bytes of text, more than the 64 MiB any of tessera's is");
  std::vector<char> buffer(size + 1, '\0');
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), size + 1);
  H5Tset_strpad(mem.get(), H5T_STR_NULLTERM);
  if (H5Aread(attr.get(), mem.get(), buffer.data()) < 0) return std::nullopt;
  return std::string(buffer.data());
}

std::optional<int64_t> h5_read_int_attr(hid_t obj, const std::string& name) {
  if (!h5_has_attr(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) return std::nullopt;
  int64_t value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &value) < 0) return std::nullopt;
  return value;
}

std::optional<double> h5_read_double_attr(hid_t obj, const std::string& name) {
  if (!h5_has_attr(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  double value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) < 0) return std::nullopt;
  return value;
}

namespace {
void write_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                const void* data) {
  if (h5_has_attr(obj, name)) H5Adelete(obj, name.c_str());
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, data) < 0)
    throw std::runtime_error("HDF5: cannot write attribute " + name);
}
}  // namespace

void h5_write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  // Fixed-length, NUL-terminated: readable by h5py, h5dump and C without variable-length buffers.
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  write_attr(obj, name, type.get(), type.get(), value.c_str());
}

void h5_write_int_attr(hid_t obj, const std::string& name, int64_t value) {
  write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void h5_write_double_attr(hid_t obj, const std::string& name, double value) {
  write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

}  // namespace tessera
