#include "train/ckpt_command.hpp"

#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_util.hpp"

namespace tessera {

const char* const kCkptUsage = R"(usage:
  tessera ckpt diff REF OTHER

diff   one line per dataset of REF's /model and /optim, tab-separated:
         NAME  max|ref|  max|other - ref|  sum(ref^2)  sum((other - ref)^2)  identical
       (identical: 1 when every value is bitwise equal, else 0), or `NAME missing` when OTHER
       lacks it or `NAME shape` when the shapes differ. Values are read as doubles; sums are in
       double. tests/integration/compare_runs.py turns these lines into a verdict.
)";

namespace {

// Every dataset below `path`, by its full name (H5Lvisit and H5Oopen: the same calls in HDF5
// 1.10 to 1.14).
std::vector<std::string> dataset_names(hid_t file, const std::string& path) {
  std::vector<std::string> names;
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return names;
  H5Handle group(H5Gopen2(file, path.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.valid()) return names;
  struct Visit {
    hid_t group;
    std::string prefix;
    std::vector<std::string>* out;
  } visit{group.get(), path + "/", &names};
  H5Lvisit(group.get(), H5_INDEX_NAME, H5_ITER_INC,
           [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
             auto* v = static_cast<Visit*>(data);
             H5Handle object(H5Oopen(v->group, name, H5P_DEFAULT), H5Oclose);
             if (object.valid() && H5Iget_type(object.get()) == H5I_DATASET)
               v->out->push_back(v->prefix + name);
             return 0;
           },
           &visit);
  return names;
}

// The dataset's values as doubles and its shape; false when it cannot be read.
bool read_dataset(hid_t file, const std::string& name, std::vector<double>& values,
                  std::vector<hsize_t>& shape, std::vector<unsigned char>& raw) {
  H5Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) return false;
  H5Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) return false;
  shape.assign(size_t(rank), 0);
  H5Sget_simple_extent_dims(space.get(), shape.data(), nullptr);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  values.assign(size_t(n), 0.0);
  H5Handle type(H5Dget_type(set.get()), H5Tclose);
  raw.assign(size_t(n) * H5Tget_size(type.get()), 0);
  if (n == 0) return true;
  return H5Dread(set.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0 &&
         H5Dread(set.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) >= 0;
}

int diff(const std::string& ref_path, const std::string& other_path) {
  // Both must be checkpoints: the same checks and messages as a restart's.
  read_checkpoint_info(ref_path);
  read_checkpoint_info(other_path);
  H5Handle ref(H5Fopen(ref_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  H5Handle other(H5Fopen(other_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!ref.valid() || !other.valid())
    throw UserError("cannot open " + (ref.valid() ? other_path : ref_path), kExitIO);
  std::vector<double> a, b;
  std::vector<hsize_t> sa, sb;
  std::vector<unsigned char> ra, rb;
  for (const char* group : {"/model", "/optim"}) {
    for (const std::string& name : dataset_names(ref.get(), group)) {
      const char* shown = name.c_str() + 1;  // "model/wte"
      if (!read_dataset(ref.get(), name, a, sa, ra))
        throw UserError(ref_path + ": cannot read " + name, kExitIO);
      if (H5Lexists(other.get(), name.c_str(), H5P_DEFAULT) <= 0) {
        std::printf("%s\tmissing\n", shown);
        continue;
      }
      if (!read_dataset(other.get(), name, b, sb, rb))
        throw UserError(other_path + ": cannot read " + name, kExitIO);
      if (sa != sb) {
        std::printf("%s\tshape\n", shown);
        continue;
      }
      double max_ref = 0, max_diff = 0, sum_ref = 0, sum_diff = 0;
      for (size_t i = 0; i < a.size(); i++) {
        const double d = b[i] - a[i];
        max_ref = std::fmax(max_ref, std::fabs(a[i]));
        max_diff = std::fmax(max_diff, std::isnan(d) ? INFINITY : std::fabs(d));
        sum_ref += a[i] * a[i];
        sum_diff += d * d;
      }
      const bool identical = ra.size() == rb.size() && std::memcmp(ra.data(), rb.data(), ra.size()) == 0;
      std::printf("%s\t%.17g\t%.17g\t%.17g\t%.17g\t%d\n", shown, max_ref, max_diff,
                  sum_ref, sum_diff, identical ? 1 : 0);
    }
  }
  return 0;
}

}  // namespace

int ckpt_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kCkptUsage, stdout);
    return args.empty() ? kExitBadInput : 0;
  }
  if (args[0] == "diff") {
    if (args.size() != 3)
      throw UserError("tessera ckpt diff: expected REF and OTHER checkpoints (see --help)");
    return diff(args[1], args[2]);
  }
  throw UserError("tessera ckpt: unknown verb '" + args[0] + "' (see tessera ckpt --help)");
}

}  // namespace tessera
