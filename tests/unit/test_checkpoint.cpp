// HDF5 checkpoints: exact round trip, checksums, shape checks, and which file restart picks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_util.hpp"
#include "model/shard.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

LocalLayout whole(const ModelShape& s) { return make_local_layout(s, 1, 0, 0, s.n_layer, true, true); }

struct Fixture {
  fs::path dir;
  LocalLayout layout = whole(make_model_shape(2, 2, 8, 16, 20, 8));
  std::vector<float> p, m, v;
  TokenizerInfo tok{"byte", 257, 256};
  Fixture() {
    dir = fs::temp_directory_path() / ("tessera_ckpt_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    p.resize(layout.total);
    m.resize(layout.total);
    v.resize(layout.total);
    init_local_parameters(p.data(), layout, 5, 0.02);
    for (size_t i = 0; i < layout.total; ++i) {
      m[i] = 1e-3f * float(i % 13);
      v[i] = 1e-6f * float(i % 17);
    }
  }
  ~Fixture() { fs::remove_all(dir); }
  // fp8: device.precision fp8's amax histories (2 layers x 12 rows + the head's 3, 4 entries).
  std::string save(int64_t step, const std::vector<float>& fp8 = {}) {
    TrainState s{step, step * 64, step * 4, 5, 1e-3, "1 data.h5 (hdf5, 100 tokens)", "epoch 0.5",
                 fp8.empty() ? 0 : 4, fp8};
    return write_checkpoint(MPI_COMM_WORLD, dir.string(), layout, true,
                            {p.data(), m.data(), v.data()}, s, "model:\n  n_layer: 2\n", tok,
                            "dp=1,tp=1,pp=1");
  }
};

}  // namespace

TEST(Checkpoint, RoundTripIsBitExact) {
  Fixture f;
  const std::string path = f.save(7);
  EXPECT_EQ(fs::path(path).filename(), "step_00000007.h5");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::vector<float> p(f.layout.total), m(f.layout.total), v(f.layout.total);
  const CheckpointInfo info =
      read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), m.data(), v.data()});
  EXPECT_EQ(p, f.p);
  EXPECT_EQ(m, f.m);
  EXPECT_EQ(v, f.v);
  EXPECT_EQ(info.state.step, 7);
  EXPECT_EQ(info.state.tokens_seen, 7 * 64);
  EXPECT_EQ(info.state.next_sample, 28);
  EXPECT_EQ(info.state.seed, 5u);
  EXPECT_EQ(info.state.data_sources, "1 data.h5 (hdf5, 100 tokens)");
  EXPECT_EQ(info.state.data_position, "epoch 0.5");
  EXPECT_EQ(info.deck_yaml, "model:\n  n_layer: 2\n");
  EXPECT_EQ(info.tokenizer.eot, 256);
  EXPECT_EQ(info.shape.padded_vocab, 24);
}

// FP8's amax histories: written whole, read back to the bit, checked by their checksum; none
// where the run had none.
TEST(Checkpoint, Fp8HistoriesRoundTrip) {
  Fixture f;
  std::vector<float> h(27 * 4, -1.0f);
  for (size_t i = 0; i < h.size(); i += 3) h[i] = 0.1f * float(i) + 1e-3f;
  const std::string path = f.save(3, h);
  std::vector<float> p(f.layout.total);
  CheckpointInfo info = read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), nullptr, nullptr});
  EXPECT_EQ(info.state.fp8_history, 4);
  EXPECT_EQ(info.state.fp8_amax, h);
  info = read_checkpoint(MPI_COMM_WORLD, f.save(4), f.layout, true, {p.data(), nullptr, nullptr});
  EXPECT_EQ(info.state.fp8_history, 0);
  EXPECT_TRUE(info.state.fp8_amax.empty());
  {  // one amax changed behind the writer's back
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "train/fp8_amax_history", H5P_DEFAULT);
    h[0] = 5.0f;
    H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data());
    H5Dclose(dset);
    H5Fclose(file);
  }
  try {
    read_checkpoint_info(path);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/train/fp8_amax_history: the checksum attribute is "
                                         "missing or does not match"),
              std::string::npos)
        << e.what();
  }
  // A table of the wrong number of rows is refused by its shape.
  h.resize(26 * 4);
  const std::string short_path = f.save(5, h);
  try {
    read_checkpoint_info(short_path);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must be a 2-D dataset of 27 rows (12 per layer of 2, "
                                         "the head's 3)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, LatestPointsAtNewestAndSurvivesAMissingLatest) {
  Fixture f;
  f.save(1);
  const std::string second = f.save(2);
  EXPECT_EQ(resolve_checkpoint(f.dir.string()), second);
  // A job killed between the rename and the `latest` update, and a half-written .tmp beside it.
  fs::remove(f.dir / "latest");
  std::ofstream(f.dir / "step_00000003.h5.tmp") << "partial";
  EXPECT_EQ(resolve_checkpoint(f.dir.string()), second);
  EXPECT_EQ(resolve_checkpoint((f.dir / "nothing").string()), "");
}

TEST(Checkpoint, ShapeMismatchNamesTheValues) {
  Fixture f;
  const std::string path = f.save(1);
  const LocalLayout other = whole(make_model_shape(3, 2, 8, 16, 20, 8));
  std::vector<float> p(other.total);
  try {
    read_checkpoint(MPI_COMM_WORLD, path, other, true, {p.data(), nullptr, nullptr});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_NE(std::string(e.what()).find("model.n_layer 2 in the checkpoint, 3 in the deck"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, CorruptionIsCaughtByTheChecksum) {
  Fixture f;
  const std::string path = f.save(1);
  {  // flip one value behind the writer's back
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "model/h.1.mlp.c_fc.weight", H5P_DEFAULT);
    std::vector<float> w(4 * 8 * 8);
    H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
    w[17] += 1.0f;
    H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
    H5Dclose(dset);
    H5Fclose(file);
  }
  std::vector<float> p(f.layout.total);
  try {
    read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), nullptr, nullptr});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in /model/h.1.mlp.c_fc.weight"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, NotACheckpoint) {
  Fixture f;
  fs::create_directories(f.dir);
  const std::string junk = (f.dir / "junk.h5").string();
  std::ofstream(junk) << "not hdf5";
  EXPECT_THROW(read_checkpoint_info(junk), UserError);
  try {
    read_checkpoint_info((f.dir / "missing.h5").string());
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitIO);
  }
}

TEST(Checkpoint, ChecksumIsSplitIndependent) {
  // The tiles of a tp = 2, 2-stage split add up to the whole model's checksum, tensor by tensor.
  const ModelShape shape = make_model_shape(2, 2, 8, 16, 20, 8);
  const LocalLayout full = whole(shape);
  std::vector<float> canonical(full.total);
  init_local_parameters(canonical.data(), full, 3, 0.02);
  std::vector<uint64_t> sums(full.tensors.size(), 0);
  for (int stage = 0; stage < 2; ++stage) {
    for (int r = 0; r < 2; ++r) {
      const LocalLayout tile = make_local_layout(shape, 2, r, stage, stage + 1, stage == 0, stage == 1);
      std::vector<float> local(tile.total);
      init_local_parameters(local.data(), tile, 3, 0.02);
      for (const LocalTensor& t : tile.tensors)
        if (t.owner) sums[t.canonical] += tile_checksum(tile, t, local.data() + t.offset);
    }
  }
  for (const LocalTensor& t : full.tensors)
    EXPECT_EQ(sums[t.canonical], tile_checksum(full, t, canonical.data() + t.offset))
        << full.canon(t).name;
  // Two values trading places change it.
  const LocalTensor& w = full.tensors[size_t(full.layer(0, kFc1W))];
  const uint64_t before = tile_checksum(full, w, canonical.data() + w.offset);
  std::swap(canonical[w.offset + 3], canonical[w.offset + 4]);
  EXPECT_NE(before, tile_checksum(full, w, canonical.data() + w.offset));
}

TEST(Checkpoint, ModelOnlyCheckpointStartsARunButContinuesNone) {
  // What tools/interop/import_weights.py writes: the model without /optim.
  Fixture f;
  const std::string path = f.save(3);
  {
    H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file.valid());
    ASSERT_GE(H5Ldelete(file.get(), "optim", H5P_DEFAULT), 0);
  }
  EXPECT_FALSE(read_checkpoint_info(path).has_optimizer);
  std::vector<float> p(f.layout.total), m(f.layout.total), v(f.layout.total);
  read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), nullptr, nullptr});
  EXPECT_EQ(p, f.p);
  try {
    read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), m.data(), v.data()});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_NE(std::string(e.what()).find("holds no optimizer state"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoint.init_from"), std::string::npos) << e.what();
  }
}

// ROMIO reads text before a ':' as a file-system prefix: a run directory named for a time of day
// must still take checkpoints, through MPI-IO, and give them back.
TEST(Checkpoint, DirectoryWithAColon) {
  Fixture f;
  EXPECT_EQ(mpiio_name("/a/b.h5"), "/a/b.h5");
  EXPECT_EQ(mpiio_name("runs/10:00/b.h5"), "ufs:runs/10:00/b.h5");
  f.dir /= "10:00";
  const std::string path = f.save(3);
  EXPECT_EQ(resolve_checkpoint(f.dir.string()), path);
  std::vector<float> p(f.layout.total), m(f.layout.total), v(f.layout.total);
  read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), m.data(), v.data()});
  EXPECT_EQ(p, f.p);
  EXPECT_EQ(probe_checkpoint_dir(MPI_COMM_WORLD, f.dir.string()), "");
  EXPECT_FALSE(fs::exists(f.dir / ".tessera-probe.h5"));
}

// A write that cannot happen is one UserError (exit 1) naming the step and what was kept, and
// leaves no .tmp file.
TEST(Checkpoint, FailedWriteKeepsTheLastOne) {
  Fixture f;
  f.save(2);
  fs::create_directories(f.dir / "step_00000004.h5.tmp");  // in the way of the new file
  try {
    f.save(4);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitIO);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("checkpoint step 4: ", 0), 0u) << what;
    EXPECT_NE(what.find(": kept step 2 (step_00000002.h5)"), std::string::npos) << what;
  }
  EXPECT_EQ(resolve_checkpoint(f.dir.string()), (f.dir / "step_00000002.h5").string());
  std::ifstream latest(f.dir / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000002.h5");
}

// Not a file: said so by name, and a FIFO is never opened (which would wait for a writer).
TEST(Checkpoint, PathsThatAreNotFiles) {
  Fixture f;
  fs::create_directories(f.dir);
  const std::string fifo = (f.dir / "fifo.h5").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(resolve_checkpoint(fifo), fifo);  // for the reader to refuse by name
  EXPECT_EQ(resolve_checkpoint((f.dir / "nothing").string()), "");
  try {
    read_checkpoint_info(fifo);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()), "checkpoint " + fifo + " is a FIFO (named pipe), not a file");
  }
}

// Sizes stored in a checkpoint are range-checked, not narrowed to int: 2^32 + 2 layers is not 2.
TEST(Checkpoint, AttributesOutOfRange) {
  Fixture f;
  const std::string path = f.save(1);
  {
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t model = H5Gopen2(file, "model", H5P_DEFAULT);
    H5Adelete(model, "n_layer");
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(model, "n_layer", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    const int64_t huge = (int64_t(1) << 32) + 2;
    H5Awrite(attr, H5T_NATIVE_INT64, &huge);
    H5Aclose(attr);
    H5Sclose(space);
    H5Gclose(model);
    H5Fclose(file);
  }
  try {
    read_checkpoint_info(path);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": attribute n_layer = 4294967298 is outside 1..1024");
  }
}

namespace {

// Replaces element `at` of dataset `name` (a whole-model layout: one tile per tensor) and stores
// the checksum of the new values, so that only the value checks can refuse the file.
void plant(const Fixture& f, const std::string& path, const std::string& prefix, size_t tensor,
           size_t at, float value) {
  const LocalTensor& t = f.layout.tensors[tensor];
  const std::string name = prefix + f.layout.canonical.tensors[t.canonical].name;
  std::vector<float> w(t.numel);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t dset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
  w[at] = value;
  H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data());
  H5Dclose(dset);
  const uint64_t sum = tile_checksum(f.layout, t, w.data());
  hid_t cset = H5Dopen2(file, ("checksum/" + name).c_str(), H5P_DEFAULT);
  H5Dwrite(cset, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &sum);
  H5Dclose(cset);
  H5Fclose(file);
}

std::string read_error(const Fixture& f, const std::string& path, int* code) {
  std::vector<float> p(f.layout.total), m(f.layout.total), v(f.layout.total);
  try {
    read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), m.data(), v.data()});
  } catch (const UserError& e) {
    *code = e.exit_code;
    return e.what();
  }
  return "";
}

}  // namespace

// A checkpoint is never written from weights or moments that are not finite; the last good one
// stays the newest.
TEST(Checkpoint, NonFiniteStateIsNeverWritten) {
  Fixture f;
  f.save(1);
  const LocalTensor& t = f.layout.tensors[3];
  const std::string name = f.layout.canonical.tensors[t.canonical].name;
  for (std::vector<float>* part : {&f.p, &f.m, &f.v}) {
    const float keep = (*part)[t.offset + 2];
    (*part)[t.offset + 2] = part == &f.m ? INFINITY : NAN;
    try {
      f.save(2);
      FAIL() << "no error";
    } catch (const UserError& e) {
      const std::string prefix = part == &f.p ? "/model/" : part == &f.m ? "/optim/exp_avg/"
                                                                          : "/optim/exp_avg_sq/";
      EXPECT_EQ(e.exit_code, kExitAnomaly);
      EXPECT_EQ(std::string(e.what()),
                "checkpoint step 2: refused: " + prefix + name + " holds " +
                    (part == &f.m ? "inf" : "nan") +
                    " at element 2 of this rank's tile: nothing written, kept step 1 "
                    "(step_00000001.h5)");
    }
    (*part)[t.offset + 2] = keep;
    EXPECT_FALSE(fs::exists(f.dir / "step_00000002.h5"));
    EXPECT_FALSE(fs::exists(f.dir / "step_00000002.h5.tmp"));
    EXPECT_EQ(fs::path(resolve_checkpoint(f.dir.string())).filename(), "step_00000001.h5");
  }
}

// Values no training state holds are refused on read, one line naming the tensor, exit 2, even
// when their checksum matches.
TEST(Checkpoint, NonFiniteOrNegativeValuesAreRefusedOnRead) {
  Fixture f;
  const std::string path = f.save(1);
  int code = 0;
  ASSERT_EQ(read_error(f, path, &code), "");
  const std::string w = f.layout.canonical.tensors[f.layout.tensors[2].canonical].name;
  plant(f, path, "model/", 2, 5, NAN);
  EXPECT_EQ(read_error(f, path, &code),
            path + ": /model/" + w + " holds nan at element 5 of this rank's tile (a checkpoint "
            "holds finite weights and moments, and non-negative exp_avg_sq)");
  EXPECT_EQ(code, kExitBadInput);
  plant(f, path, "model/", 2, 5, 0.5f);
  ASSERT_EQ(read_error(f, path, &code), "");
  plant(f, path, "optim/exp_avg_sq/", 4, 1, -1.0f);
  EXPECT_NE(read_error(f, path, &code).find("/optim/exp_avg_sq/" +
                                            f.layout.canonical.tensors[f.layout.tensors[4].canonical].name +
                                            " holds -1 at element 1"),
            std::string::npos);
  EXPECT_EQ(code, kExitBadInput);
  plant(f, path, "optim/exp_avg_sq/", 4, 1, 0.0f);
  plant(f, path, "optim/exp_avg/", 0, 0, -INFINITY);
  EXPECT_NE(read_error(f, path, &code).find(" holds -inf at element 0"), std::string::npos);
}

// The restart state is covered by state_checksum: an in-range value changed after the write is
// refused; a value out of range by its range check first.
TEST(Checkpoint, RestartStateIsChecksummed) {
  Fixture f;
  const std::string path = f.save(3);
  auto set_int = [&](const char* group, const char* name, int64_t value) {
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = H5Gopen2(file, group, H5P_DEFAULT);
    h5_write_int_attr(g, name, value);
    H5Gclose(g);
    H5Fclose(file);
  };
  EXPECT_EQ(read_checkpoint_info(path).state.next_sample, 12);
  for (const auto& [group, name, value] :
       {std::tuple{"train", "next_sample", int64_t(13)}, std::tuple{"/", "step", int64_t(4)},
        std::tuple{"train", "seed", int64_t(6)}, std::tuple{"model", "ffn_hidden", int64_t(16)}}) {
    f.save(3);  // a fresh file each time
    set_int(group, name, value);
    try {
      read_checkpoint_info(path);
      FAIL() << "no error for " << name;
    } catch (const UserError& e) {
      EXPECT_EQ(e.exit_code, kExitBadInput);
      EXPECT_EQ(std::string(e.what()),
                path + ": attribute state_checksum does not match the restart attributes (step, "
                "tokens_seen, /train next_sample, seed, lr, data_sources, data_position, the "
                "/model shape): one was changed after the write")
          << name;
    }
  }
  f.save(3);
  set_int("train", "next_sample", -1);
  try {
    read_checkpoint_info(path);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("next_sample = -1 is outside"), std::string::npos)
        << e.what();
  }
  f.save(3);
  {
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(file, "state_checksum");
    H5Fclose(file);
  }
  EXPECT_THROW(read_checkpoint_info(path), UserError);
}
