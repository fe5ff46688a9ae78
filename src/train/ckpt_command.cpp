#include "train/ckpt_command.hpp"

#include <hdf5.h>

#include <algorithm>
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
  tessera ckpt info CKPT
  tessera ckpt verify CKPT

diff   one line per dataset of REF's /model and /optim, tab-separated:
         NAME  max|ref|  max|other - ref|  sum(ref^2)  sum((other - ref)^2)  identical
       (identical: 1 when every value is bitwise equal, else 0), or `NAME missing` when OTHER
       lacks it or `NAME shape` when the shapes differ. Values are read as doubles; sums are in
       double. tests/integration/compare_runs.py turns these lines into a verdict.
info   the step, restart state, layout it was saved on, model shape and tokenizer, one line per
       tensor (name, shape, bytes), then the deck it was written with.
verify reads every tensor and checks its checksum, that weights and moments are finite and
       exp_avg_sq non-negative, and the restart state's checksum: `ok: ...` and exit 0, or one
       line naming the first bad tensor or attribute (exit 1 for a checksum mismatch, 2 else).
CKPT is a checkpoint file or a directory (its newest complete checkpoint).
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

std::string checkpoint_path(const std::string& arg) {
  const std::string path = resolve_checkpoint(arg);
  if (path.empty()) throw UserError(arg + ": no such checkpoint file or directory with one", kExitIO);
  return path;
}

int info(const std::string& arg) {
  const std::string path = checkpoint_path(arg);
  const CheckpointInfo c = read_checkpoint_info(path);
  const ModelShape& m = c.shape;
  std::printf("checkpoint %s\nstep %lld, tokens_seen %lld, next_sample %lld, seed %llu, lr %.9g\n",
              path.c_str(), (long long)c.state.step, (long long)c.state.tokens_seen,
              (long long)c.state.next_sample, (unsigned long long)c.state.seed, c.state.lr);
  // The rule that wrote the optimizer state and its tensors' names (the groups of /optim).
  std::string optim = "no (model only)";
  if (c.has_optimizer) {
    optim = c.optim_rule + " (";
    for (size_t k = 0; k < c.optim_state.size(); ++k)
      optim += (k ? ", " : "") + c.optim_state[k];
    optim += "), " + std::to_string(c.state.optim_step) + " steps";
  }
  std::printf("saved_layout %s, optimizer state %s\n", c.saved_layout.c_str(), optim.c_str());
  std::printf("model %s: n_layer %d, n_head %d, n_kv_head %d, n_embd %d, ffn_hidden %d, "
              "block_size %d, vocab_size %d (padded %d), %s%s\n",
              arch_name(m.arch), m.n_layer, m.n_head, m.n_kv_head, m.n_embd, m.ffn_hidden,
              m.block_size, m.vocab_size, m.padded_vocab, m.tied ? "tied" : "untied",
              m.qk_norm ? ", q/k norms" : "");
  std::printf("tokenizer %s, vocab_size %lld, eot %lld\n", c.tokenizer.type.c_str(),
              (long long)c.tokenizer.vocab_size, (long long)c.tokenizer.eot);
  if (!c.state.data_sources.empty())
    std::printf("data %s at %s\n", c.state.data_sources.c_str(), c.state.data_position.c_str());
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw UserError("cannot open checkpoint " + path, kExitIO);
  double total = 0;
  size_t count = 0;
  for (const char* group : {"/model", "/optim"})
    for (const std::string& name : dataset_names(file.get(), group)) {
      H5Handle set(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
      H5Handle space(H5Dget_space(set.get()), H5Sclose);
      H5Handle type(H5Dget_type(set.get()), H5Tclose);
      std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
      H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
      std::string shape;
      for (hsize_t d : dims) {
        if (!shape.empty()) shape += 'x';
        shape.append(std::to_string(d));
      }
      const double bytes = double(H5Sget_simple_extent_npoints(space.get())) *
                           double(H5Tget_size(type.get()));
      std::printf("tensor %s [%s] %.0f bytes\n", name.c_str() + 1, shape.c_str(), bytes);
      total += bytes;
      ++count;
    }
  std::printf("%zu tensors, %.0f bytes\ndeck:\n%s", count, total, c.deck_yaml.c_str());
  return 0;
}

int verify(const std::string& arg) {
  const std::string path = checkpoint_path(arg);
  const CheckpointInfo c = verify_checkpoint(path);
  std::printf("ok: %s: step %lld, every checksum, value and the restart state verified%s\n",
              path.c_str(), (long long)c.state.step,
              c.has_optimizer ? "" : " (model only: no optimizer state)");
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
  if (args[0] == "info" || args[0] == "verify") {
    if (args.size() != 2)
      throw UserError("tessera ckpt " + args[0] + ": expected one checkpoint (see --help)");
    return args[0] == "info" ? info(args[1]) : verify(args[1]);
  }
  throw UserError("tessera ckpt: unknown verb '" + args[0] + "' (see tessera ckpt --help)");
}

}  // namespace tessera
