// device.precision fp8: the amax histories in a checkpoint (TrainState::fp8_amax), one dataset
// /train/fp8_amax_history [rows, history] in canonical layer order, whatever layout wrote it,
// with an order-free checksum attribute beside it (io/checkpoint.hpp, element_hash).
#include <cmath>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_format.hpp"
#include "io/hdf5_util.hpp"
#include "model/fp8.hpp"

namespace tessera::ckpt {

namespace {

constexpr const char* kFp8Dataset = "fp8_amax_history";

uint64_t fp8_checksum(const std::vector<float>& values) {
  uint64_t sum = 0;
  for (size_t i = 0; i < values.size(); ++i) sum += element_hash(i, values[i]);
  return sum;
}

}  // namespace

void write_fp8_history(hid_t train, const TrainState& state, bool write_data) {
  if (state.fp8_amax.empty()) return;
  const hsize_t dims[2] = {state.fp8_amax.size() / size_t(state.fp8_history),
                           hsize_t(state.fp8_history)};
  H5Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(train, kFp8Dataset, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                           H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
  if (!dset.valid())
    throw UserError("HDF5: cannot create /train/" + std::string(kFp8Dataset), kExitIO);
  h5_write_int_attr(dset.get(), "checksum", int64_t(fp8_checksum(state.fp8_amax)));
  if (write_data && H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                             transfer(H5FD_MPIO_INDEPENDENT).get(), state.fp8_amax.data()) < 0)
    throw UserError("HDF5: cannot write /train/" + std::string(kFp8Dataset), kExitIO);
}

void read_fp8_history(hid_t train, const std::string& path, int n_layer, TrainState& state) {
  state.fp8_history = 0;
  state.fp8_amax.clear();
  if (H5Lexists(train, kFp8Dataset, H5P_DEFAULT) <= 0) return;
  const std::string name = path + ": /train/" + kFp8Dataset;
  H5Handle dset(H5Dopen2(train, kFp8Dataset, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) throw UserError(name + ": cannot open the dataset");
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  hsize_t dims[2] = {0, 0};
  const hsize_t rows = hsize_t(n_layer) * Fp8State::kPerLayer + Fp8State::kRoles;
  if (H5Sget_simple_extent_ndims(space.get()) != 2 ||
      H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0 || dims[0] != rows ||
      dims[1] < 1 || dims[1] > 1024)
    throw UserError(name + ": must be a 2-D dataset of " + std::to_string(rows) + " rows (" +
                    std::to_string(Fp8State::kPerLayer) + " per layer of " +
                    std::to_string(n_layer) + ", the head's " +
                    std::to_string(Fp8State::kRoles) + ") of 1 to 1024 amaxes");
  std::vector<float> values(size_t(dims[0] * dims[1]));
  if (!values.empty() && H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 values.data()) < 0)
    throw UserError(name + ": read failed", kExitIO);
  const auto stored = h5_read_int_attr(dset.get(), "checksum");
  if (!stored || uint64_t(*stored) != fp8_checksum(values))
    throw UserError(name + ": the checksum attribute is missing or does not match the values");
  for (float v : values)
    if (std::isnan(v) || v < -1)
      throw UserError(name + ": holds " + std::to_string(v) + " (an amax is >= 0, or -1: none)");
  state.fp8_history = int(dims[1]);
  state.fp8_amax = std::move(values);
}

}  // namespace tessera::ckpt
