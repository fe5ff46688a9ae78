// The run's small state tables in a checkpoint, under /train, layout-free: device.precision fp8's
// amax histories (TrainState::fp8_amax, /train/fp8_amax_history [rows, history] in canonical
// layer order) and model.moe.bias_rate's selection biases (TrainState::moe_bias, /train/moe_bias
// [MoE layers, experts]). Each is one 2-D float dataset, whatever layout wrote it, with an
// order-free checksum attribute beside it (io/checkpoint.hpp, element_hash).
#include <cmath>
#include <functional>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_format.hpp"
#include "io/hdf5_util.hpp"
#include "model/cost.hpp"
#include "model/fp8.hpp"

namespace tessera::ckpt {

namespace {

constexpr const char* kFp8Dataset = "fp8_amax_history";
constexpr const char* kBiasDataset = "moe_bias";

uint64_t table_checksum(const std::vector<float>& values) {
  uint64_t sum = 0;
  for (size_t i = 0; i < values.size(); ++i) sum += element_hash(i, values[i]);
  return sum;
}

// `values` as /train/NAME [values / cols, cols]: created by every rank (collective metadata),
// its data written where write_data.
void write_table(hid_t train, const char* name, const std::vector<float>& values, size_t cols,
                 bool write_data) {
  const hsize_t dims[2] = {values.size() / cols, hsize_t(cols)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(train, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose);
  if (!dset.valid()) throw UserError("HDF5: cannot create /train/" + std::string(name), kExitIO);
  h5_write_int_attr(dset.get(), "checksum", int64_t(table_checksum(values)));
  if (write_data && H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             transfer(H5FD_MPIO_INDEPENDENT).get(), values.data()) < 0)
    throw UserError("HDF5: cannot write /train/" + std::string(name), kExitIO);
}

// /train/NAME read back into `values` (its columns into *cols); false where the checkpoint has
// none. shape(rows, cols) says what is wrong with a shape ("" when right), before anything is
// read; the checksum and `value`'s verdict on each element ("" when right) are checked after.
bool read_table(hid_t train, const std::string& path, const char* name,
                const std::function<std::string(hsize_t, hsize_t)>& shape,
                const std::function<std::string(float)>& value, std::vector<float>* values,
                hsize_t* cols) {
  if (H5Lexists(train, name, H5P_DEFAULT) <= 0) return false;
  const std::string where = path + ": /train/" + name;
  H5Handle dset(H5Dopen2(train, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) throw UserError(where + ": cannot open the dataset");
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t dims[2] = {0, 0};
  const bool two_d = H5Sget_simple_extent_ndims(space.get()) == 2 &&
                     H5Sget_simple_extent_dims(space.get(), dims, nullptr) >= 0;
  if (std::string bad = shape(dims[0], dims[1]); !two_d || !bad.empty())
    throw UserError(where + ": must be " + (bad.empty() ? shape(0, 0) : bad));
  values->assign(size_t(dims[0] * dims[1]), 0.0f);
  if (!values->empty() && H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                  values->data()) < 0)
    throw UserError(where + ": read failed", kExitIO);
  const auto stored = h5_read_int_attr(dset.get(), "checksum");
  if (!stored || uint64_t(*stored) != table_checksum(*values))
    throw UserError(where + ": the checksum attribute is missing or does not match the values");
  for (float v : *values)
    if (std::string bad = value(v); !bad.empty()) throw UserError(where + ": holds " + bad);
  *cols = dims[1];
  return true;
}

}  // namespace

void write_fp8_history(hid_t train, const TrainState& state, bool write_data) {
  if (state.fp8_amax.empty()) return;
  write_table(train, kFp8Dataset, state.fp8_amax, size_t(state.fp8_history), write_data);
}

void read_fp8_history(hid_t train, const std::string& path, int n_layer, int moe_layers,
                      int experts, TrainState& state) {
  state.fp8_history = 0;
  state.fp8_amax.clear();
  const hsize_t rows = Fp8State::table_rows(n_layer, moe_layers, experts);
  const std::string moe =
      moe_layers == 0 ? ""
                      : ", " + std::to_string(Fp8State::expert_rows(experts)) +
                            " per MoE layer of " + std::to_string(moe_layers) + "'s experts";
  auto shape = [&](hsize_t r, hsize_t c) {
    return r == rows && c >= 1 && c <= 1024
               ? std::string()
               : "a 2-D dataset of " + std::to_string(rows) + " rows (" +
                     std::to_string(Fp8State::kPerLayer) + " per layer of " +
                     std::to_string(n_layer) + ", the head's " +
                     std::to_string(Fp8State::kRoles) + moe + ") of 1 to 1024 amaxes";
  };
  auto value = [](float v) {
    return std::isnan(v) || v < -1 ? std::to_string(v) + " (an amax is >= 0, or -1: none)"
                                   : std::string();
  };
  hsize_t cols = 0;
  if (read_table(train, path, kFp8Dataset, shape, value, &state.fp8_amax, &cols))
    state.fp8_history = int(cols);
}

void write_moe_bias(hid_t train, const TrainState& state, int experts, bool write_data) {
  if (state.moe_bias.empty()) return;
  write_table(train, kBiasDataset, state.moe_bias, size_t(experts), write_data);
}

void read_moe_bias(hid_t train, const std::string& path, const ModelShape& shape,
                   TrainState& state) {
  state.moe_bias.clear();
  const hsize_t rows = hsize_t(moe_layers(shape, 0, shape.n_layer));
  auto dims = [&](hsize_t r, hsize_t c) {
    return r == rows && c == hsize_t(shape.moe.experts)
               ? std::string()
               : "a 2-D dataset of " + std::to_string(rows) + " rows (the model's MoE layers) of " +
                     std::to_string(shape.moe.experts) + " biases (its experts)";
  };
  auto value = [](float v) {
    return std::isfinite(v) ? std::string() : std::to_string(v) + " (not finite)";
  };
  hsize_t cols = 0;
  read_table(train, path, kBiasDataset, dims, value, &state.moe_bias, &cols);
}

}  // namespace tessera::ckpt
