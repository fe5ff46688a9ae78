// The optimizer seam (optim/rule.hpp): the rules' declared state, Adafactor's CPU ops against a
// float64 computation of the rule (backend/adafactor.hpp), the same ops over a matrix cut into
// tensor-parallel blocks and ZeRO slices, and checkpoints of a rule's state by its names.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "model/shard.hpp"
#include "optim/rule.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

// The rule in double, for one tensor of shape [R, C] (C = 1: a vector), as backend/adafactor.hpp
// writes it.
struct Reference {
  size_t R, C;
  std::vector<double> p, m, v, row, col;
  Reference(size_t R, size_t C, const std::vector<float>& p0)
      : R(R), C(C), p(p0.begin(), p0.end()), m(R * C), v(R * C), row(R), col(C) {}
  void step(const std::vector<float>& g, const AdafactorHyper& h, double lr, long t, bool decay) {
    const double b2 = 1.0 - std::pow(double(t), h.decay_rate);
    std::vector<double> u(R * C);
    if (C > 1) {
      for (size_t i = 0; i < R; ++i) {
        double s = 0;
        for (size_t j = 0; j < C; ++j) s += double(g[i * C + j]) * g[i * C + j];
        row[i] = b2 * row[i] + (1 - b2) * (s / double(C) + h.eps);
      }
      for (size_t j = 0; j < C; ++j) {
        double s = 0;
        for (size_t i = 0; i < R; ++i) s += double(g[i * C + j]) * g[i * C + j];
        col[j] = b2 * col[j] + (1 - b2) * (s / double(R) + h.eps);
      }
      double mean = 0;
      for (double r : row) mean += r / double(R);
      for (size_t i = 0; i < R; ++i)
        for (size_t j = 0; j < C; ++j) u[i * C + j] = g[i * C + j] / std::sqrt(row[i] * col[j] / mean);
    } else {
      for (size_t i = 0; i < R; ++i) {
        v[i] = b2 * v[i] + (1 - b2) * (double(g[i]) * g[i] + h.eps);
        u[i] = g[i] / std::sqrt(v[i]);
      }
    }
    double ss = 0;
    for (double x : u) ss += x * x;
    const double clip = std::max(1.0, std::sqrt(ss / double(R * C)) / h.clip_threshold);
    for (size_t k = 0; k < R * C; ++k) {
      double x = u[k] / clip;
      if (h.beta1 > 0) x = m[k] = h.beta1 * m[k] + (1 - h.beta1) * x;
      p[k] = p[k] * (decay ? 1 - lr * h.weight_decay : 1.0) - lr * x;
    }
  }
};

std::vector<float> randoms(size_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& y : x) y = d(gen);
  return x;
}

// One piece of a matrix in the CPU ops' terms: elements [at, at + n) of the tensor, a window of
// its block.
struct Cut {
  size_t at, n;
  MatrixWindow w;
};

// A [R, C] matrix's step by the CPU ops over `cuts` (together every element once), as a rank
// holding all of them would take it: the sums of every cut, then the factors, Σ U² of every cut
// (one tensor), the update of every cut.
void ops_step(std::vector<float>& p, std::vector<float>& m, std::vector<float>& row,
              std::vector<float>& col, const std::vector<float>& g, const std::vector<Cut>& cuts,
              size_t R, size_t C, const AdafactorHyper& h, double lr, long t) {
  std::vector<float> rs(R, 0.0f), cs(C, 0.0f);
  for (const Cut& c : cuts) cpu::adafactor_sums(rs.data(), cs.data(), g.data() + c.at, c.n, c.w);
  float mean = 0;
  cpu::adafactor_factors(row.data(), col.data(), &mean, rs.data(), cs.data(), R, C, h, t);
  double ss = 0;
  for (const Cut& c : cuts) {
    SecondMoment s{row.data(), col.data(), &mean, c.w, nullptr};
    cpu::adafactor_rms(&ss, g.data() + c.at, s, c.n, h, t);
  }
  const float inv = float(1.0 / std::max(1.0, std::sqrt(ss / double(R * C)) / h.clip_threshold));
  for (const Cut& c : cuts) {
    SecondMoment s{row.data(), col.data(), &mean, c.w, nullptr};
    cpu::adafactor_update(p.data() + c.at, nullptr, g.data() + c.at,
                          h.beta1 > 0 ? m.data() + c.at : nullptr, s, c.n, true, h, lr, inv);
  }
}

double worst_relative(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (double x : b) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
  return worst;
}

}  // namespace

TEST(OptimRules, DeclaredState) {
  OptimHyper adamw;
  ASSERT_EQ(rule_state(adamw).size(), 2u);
  EXPECT_EQ(rule_state(adamw)[1].name, "exp_avg_sq");
  OptimHyper af;
  af.rule = OptimRule::Adafactor;
  std::vector<StateSpec> s = rule_state(af);
  ASSERT_EQ(s.size(), 4u);  // beta1 0.9: a first moment
  af.adafactor.beta1 = 0;
  s = rule_state(af);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "exp_avg_sq");
  EXPECT_FALSE(known_rule("sgd"));
  EXPECT_TRUE(rule_state_names("sgd").empty());

  const ModelShape shape = make_model_shape(1, 2, 8, 16, 20, 8);  // wte [24, 8], wpe [16, 8]
  const LocalLayout tile = make_local_layout(shape, 1, 0, 0, 1, true, true);
  const ParamTensor& wte = tile.canonical.tensors[size_t(tile.canonical.embed)];
  const ParamTensor& ln = tile.canonical.tensors[size_t(tile.canonical.norm_weight)];
  EXPECT_TRUE(s[0].holds(ln));   // exp_avg_sq: vectors only
  EXPECT_FALSE(s[0].holds(wte));
  EXPECT_TRUE(s[1].holds(wte));  // rows of matrices
  EXPECT_FALSE(s[1].holds(ln));
  EXPECT_EQ(s[1].shape_of(wte), std::vector<size_t>{24});
  EXPECT_EQ(s[2].shape_of(wte), std::vector<size_t>{8});
  // Host layouts: the vectors' elements at the tile's offsets; one row vector per matrix.
  size_t rows = 0;
  for (const ParamTensor& c : tile.canonical.tensors)
    if (c.shape.size() == 2) rows += c.shape[0];
  EXPECT_EQ(state_host_layout(s[1], tile, tile.total).total, rows);
  EXPECT_EQ(state_host_layout(s[0], tile, tile.total).total, tile.total);
}

// The CPU ops, over the whole matrix and over it cut as tensor parallelism and a ZeRO-1 slice
// cut it, against the rule in double, for 4 steps with the first moment, weight decay and
// clipping all at work; and a vector's.
TEST(AdafactorOps, MatchFloat64Reference) {
  const size_t R = 6, C = 5;
  AdafactorHyper h;
  h.clip_threshold = 0.8;  // the clip bites on some steps
  const std::vector<float> p0 = randoms(R * C, 1, 0.1f);
  Reference ref(R, C, p0);
  std::vector<float> p = p0, m(R * C), row(R), col(C);
  std::vector<float> q = p0, mq(R * C), rowq(R), colq(C);
  // Two column halves (a row-parallel split: blocks [rows 0-5] x [cols 0-1], [0-5] x [2-4]) held
  // as two local tensors one after another, the second cut again by a slice boundary at 7.
  const std::vector<Cut> whole = {{0, R * C, {0, C, 0, 0}}};
  for (long t = 1; t <= 4; ++t) {
    const std::vector<float> g = randoms(R * C, unsigned(10 + t), t == 3 ? 3.0f : 0.01f);
    ref.step(g, h, 1e-2, t, true);
    ops_step(p, m, row, col, g, whole, R, C, h, 1e-2, t);
    // The same gradient as two column blocks, local [6, 2] then [6, 3].
    std::vector<float> g2(R * C), q2(R * C), m2(R * C);
    auto to_blocks = [&](const std::vector<float>& x, std::vector<float>& out) {
      for (size_t i = 0; i < R; ++i)
        for (size_t j = 0; j < C; ++j)
          out[j < 2 ? i * 2 + j : R * 2 + i * 3 + (j - 2)] = x[i * C + j];
    };
    to_blocks(g, g2);
    to_blocks(q, q2);
    to_blocks(mq, m2);
    const std::vector<Cut> cuts = {{0, 12, {0, 2, 0, 0}}, {12, 7, {0, 3, 0, 2}},
                                   {19, 11, {7, 3, 0, 2}}};
    ops_step(q2, m2, rowq, colq, g2, cuts, R, C, h, 1e-2, t);
    for (size_t i = 0; i < R; ++i)
      for (size_t j = 0; j < C; ++j) {
        const size_t at = j < 2 ? i * 2 + j : R * 2 + i * 3 + (j - 2);
        q[i * C + j] = q2[at];
        mq[i * C + j] = m2[at];
      }
    EXPECT_LT(worst_relative(p, ref.p), 1e-6) << "step " << t;
    EXPECT_LT(worst_relative(q, ref.p), 1e-6) << "step " << t << " (cut)";
    EXPECT_LT(worst_relative(row, ref.row), 1e-6) << "step " << t;
    EXPECT_LT(worst_relative(colq, ref.col), 1e-6) << "step " << t;
  }
  // The comparison can fail: another learning rate is told apart.
  Reference other(R, C, p0);
  std::vector<float> po = p0, mo(R * C), ro(R), co(C);
  const std::vector<float> g = randoms(R * C, 11, 0.01f);
  other.step(g, h, 1e-2, 1, true);
  ops_step(po, mo, ro, co, g, whole, R, C, h, 1.1e-2, 1);
  EXPECT_GT(worst_relative(po, other.p), 1e-4);

  // A vector: v per element, no decay, no first moment.
  AdafactorHyper hv = h;
  hv.beta1 = 0;
  const std::vector<float> b0 = randoms(7, 3, 0.1f);
  Reference vr(7, 1, b0);
  std::vector<float> b = b0, v(7);
  for (long t = 1; t <= 3; ++t) {
    const std::vector<float> gv = randoms(7, unsigned(20 + t), 0.02f);
    vr.step(gv, hv, 1e-2, t, false);
    SecondMoment s;
    s.v = v.data();
    double ss = 0;
    cpu::adafactor_rms(&ss, gv.data(), s, 7, hv, t);
    const float inv = float(1.0 / std::max(1.0, std::sqrt(ss / 7) / hv.clip_threshold));
    cpu::adafactor_update(b.data(), nullptr, gv.data(), nullptr, s, 7, false, hv, 1e-2, inv);
    EXPECT_LT(worst_relative(b, vr.p), 1e-6) << "vector step " << t;
  }
}

namespace {

struct CkptFixture {
  fs::path dir = fs::temp_directory_path() /
                 ("tessera_optim_" + std::to_string(getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  LocalLayout layout;
  std::vector<StateSpec> specs;
  std::vector<std::vector<float>> state;
  std::vector<float> p;
  CkptFixture() {
    const ModelShape shape = make_model_shape(2, 2, 8, 16, 20, 8);
    layout = make_local_layout(shape, 1, 0, 0, shape.n_layer, true, true);
    OptimHyper h;
    h.rule = OptimRule::Adafactor;
    specs = rule_state(h);
    p.resize(layout.total);
    init_local_parameters(p.data(), layout, 5, 0.02);
    for (size_t k = 0; k < specs.size(); ++k) {
      state.push_back(randoms(state_host_layout(specs[k], layout, layout.total).total,
                              unsigned(k + 1), 1e-3f));
      if (specs[k].non_negative)
        for (float& x : state.back()) x = std::fabs(x);
    }
    fs::remove_all(dir);
  }
  ~CkptFixture() { fs::remove_all(dir); }
  ModelBuffers buffers(std::vector<std::vector<float>>& s, float* params) {
    std::vector<StateBuffer> b;
    for (size_t k = 0; k < specs.size(); ++k) b.push_back({specs[k], s[k].data()});
    return {params, "adafactor", b};
  }
  std::string save() {
    TrainState st{9, 9 * 64, 36, 5, 1e-3, "", "", 0, {}};
    st.optim_step = 4;  // a state reset 5 steps into the run
    return write_checkpoint(MPI_COMM_WORLD, dir.string(), layout, true, buffers(state, p.data()),
                            st, "", TokenizerInfo{"byte", 257, 256}, "dp=1,tp=1,pp=1");
  }
};

}  // namespace

// Adafactor's state by its names: the rule attribute, the row and column vectors' shapes, an exact
// round trip, the optimizer's own step count.
TEST(OptimCheckpoint, AdafactorStateRoundTrip) {
  CkptFixture f;
  const std::string path = f.save();
  const CheckpointInfo info = read_checkpoint_info(path);
  EXPECT_EQ(info.optim_rule, "adafactor");
  EXPECT_EQ(info.optim_state,
            (std::vector<std::string>{"exp_avg", "exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col"}));
  EXPECT_EQ(info.state.optim_step, 4);
  std::vector<std::vector<float>> back(f.state.size());
  for (size_t k = 0; k < back.size(); ++k) back[k].assign(f.state[k].size(), -1.0f);
  std::vector<float> p(f.layout.total);
  read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, f.buffers(back, p.data()));
  EXPECT_EQ(p, f.p);
  for (size_t k = 0; k < back.size(); ++k) {
    // Elementwise vectors-only state: only the vectors' elements are the checkpoint's.
    for (const LocalTensor& t : f.layout.tensors)
      if (!f.specs[k].whole() && !f.specs[k].holds(f.layout.canon(t)))
        std::copy(f.state[k].begin() + long(t.offset),
                  f.state[k].begin() + long(t.offset + t.numel), back[k].begin() + long(t.offset));
    EXPECT_EQ(back[k], f.state[k]) << f.specs[k].name;
  }
  EXPECT_NO_THROW(verify_checkpoint(path));
}

// Another rule's state is one line naming both rules and their state, and what to set; AdamW's
// two moments from a file without the rule attribute (every checkpoint before it) are AdamW's.
TEST(OptimCheckpoint, AnotherRulesStateIsOneLine) {
  CkptFixture f;
  const std::string path = f.save();
  std::vector<float> p(f.layout.total), m(f.layout.total), v(f.layout.total);
  try {
    read_checkpoint(MPI_COMM_WORLD, path, f.layout, true, {p.data(), m.data(), v.data()});
    FAIL() << "an Adafactor state was read as AdamW's";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()),
              path + ": its optimizer state was written by optim.name = adafactor (exp_avg, "
                     "exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col), the deck's optim.name = adamw "
                     "reads exp_avg, exp_avg_sq: set optim.name: adafactor and its settings to "
                     "continue it, or optim.reset_state: true to start adamw's state afresh from "
                     "these weights");
  }
  // Adafactor without a first moment reads an Adafactor state with one; with beta1 > 0 it needs
  // the first moment, which a beta1 = 0 state does not hold.
  OptimHyper h;
  h.rule = OptimRule::Adafactor;
  h.adafactor.beta1 = 0;
  const CheckpointInfo info = read_checkpoint_info(path);
  EXPECT_EQ(optimizer_state_problem(info, "adafactor", rule_state(h)), "");
  CheckpointInfo without = info;
  without.optim_state.erase(without.optim_state.begin());
  h.adafactor.beta1 = 0.9;
  EXPECT_NE(optimizer_state_problem(without, "adafactor", rule_state(h))
                .find("needs optimizer state exp_avg, exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col, "
                      "the checkpoint holds exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col (no "
                      "exp_avg)"),
            std::string::npos);

  // AdamW's file, its rule attribute removed: still AdamW's.
  for (size_t i = 0; i < m.size(); ++i) m[i] = 1e-3f * float(i % 7), v[i] = 1e-6f * float(i % 5);
  fs::remove_all(f.dir);
  TrainState st{3, 3 * 64, 12, 5, 1e-3, "", "", 0, {}};
  const std::string old = write_checkpoint(MPI_COMM_WORLD, f.dir.string(), f.layout, true,
                                           {f.p.data(), m.data(), v.data()}, st, "",
                                           TokenizerInfo{"byte", 257, 256}, "dp=1,tp=1,pp=1");
  hid_t file = H5Fopen(old.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t group = H5Gopen2(file, "optim", H5P_DEFAULT);
  ASSERT_GE(H5Adelete(group, "rule"), 0);
  H5Gclose(group);
  H5Fclose(file);
  EXPECT_EQ(read_checkpoint_info(old).optim_rule, "adamw");
  std::vector<float> m2(m.size()), v2(v.size());
  read_checkpoint(MPI_COMM_WORLD, old, f.layout, true, {p.data(), m2.data(), v2.data()});
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);
}
