// model.moe.bias_rate: the MoE layers' selection biases in a checkpoint (TrainState::moe_bias),
// one dataset /train/moe_bias [MoE layers, experts] in canonical layer order, whatever layout
// wrote it, with an order-free checksum attribute beside it (io/checkpoint.hpp, element_hash).
#include <cmath>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_format.hpp"
#include "io/hdf5_util.hpp"
#include "model/cost.hpp"

namespace tessera::ckpt {

namespace {

constexpr const char* kBiasDataset = "moe_bias";

uint64_t bias_checksum(const std::vector<float>& values) {
  uint64_t sum = 0;
  for (size_t i = 0; i < values.size(); ++i) sum += element_hash(i, values[i]);
  return sum;
}

}  // namespace

void write_moe_bias(hid_t train, const TrainState& state, int experts, bool write_data) {
  if (state.moe_bias.empty()) return;
  const hsize_t dims[2] = {state.moe_bias.size() / size_t(experts), hsize_t(experts)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(train, kBiasDataset, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                           H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
  if (!dset.valid())
    throw UserError("HDF5: cannot create /train/" + std::string(kBiasDataset), kExitIO);
  h5_write_int_attr(dset.get(), "checksum", int64_t(bias_checksum(state.moe_bias)));
  if (write_data && H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             transfer(H5FD_MPIO_INDEPENDENT).get(), state.moe_bias.data()) < 0)
    throw UserError("HDF5: cannot write /train/" + std::string(kBiasDataset), kExitIO);
}

void read_moe_bias(hid_t train, const std::string& path, const ModelShape& shape,
                   TrainState& state) {
  state.moe_bias.clear();
  if (H5Lexists(train, kBiasDataset, H5P_DEFAULT) <= 0) return;
  const std::string name = path + ": /train/" + kBiasDataset;
  H5Handle dset(H5Dopen2(train, kBiasDataset, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) throw UserError(name + ": cannot open the dataset");
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t dims[2] = {0, 0};
  const hsize_t rows = hsize_t(moe_layers(shape, 0, shape.n_layer));
  if (H5Sget_simple_extent_ndims(space.get()) != 2 ||
      H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0 || dims[0] != rows ||
      dims[1] != hsize_t(shape.moe.experts))
    throw UserError(name + ": must be a 2-D dataset of " + std::to_string(rows) +
                    " rows (the model's MoE layers) of " + std::to_string(shape.moe.experts) +
                    " biases (its experts)");
  std::vector<float> values(size_t(dims[0] * dims[1]));
  if (!values.empty() && H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 values.data()) < 0)
    throw UserError(name + ": read failed", kExitIO);
  const auto stored = h5_read_int_attr(dset.get(), "checksum");
  if (!stored || uint64_t(*stored) != bias_checksum(values))
    throw UserError(name + ": the checksum attribute is missing or does not match the values");
  for (float v : values)
    if (!std::isfinite(v)) throw UserError(name + ": holds " + std::to_string(v) + " (not finite)");
  state.moe_bias = std::move(values);
}

}  // namespace tessera::ckpt
