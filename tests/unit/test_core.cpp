// Sample order, initialisation, LR schedule and AdamW against hand computations.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "io/sample_order.hpp"
#include "model/init.hpp"
#include "model/shard.hpp"
#include "model/param_layout.hpp"
#include "backend/adamw.hpp"
#include "optim/clip.hpp"
#include "optim/lr_schedule.hpp"

using namespace tessera;

TEST(SampleOrder, PermuteIsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 17ull, 64ull, 1000ull, 4097ull}) {
    std::set<uint64_t> seen;
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t w = permute(j, n, 1337, 0);
      ASSERT_LT(w, n);
      seen.insert(w);
    }
    EXPECT_EQ(seen.size(), n) << "n=" << n;
  }
}

TEST(SampleOrder, DependsOnSeedAndEpochOnly) {
  const uint64_t n = 1000;
  int same_epoch = 0, same_seed = 0;
  for (uint64_t j = 0; j < n; ++j) {
    EXPECT_EQ(permute(j, n, 7, 3), permute(j, n, 7, 3));
    same_epoch += permute(j, n, 7, 0) == permute(j, n, 7, 1);
    same_seed += permute(j, n, 7, 0) == permute(j, n, 8, 0);
  }
  EXPECT_LT(same_epoch, 20);  // a fresh shuffle each epoch
  EXPECT_LT(same_seed, 20);
  EXPECT_EQ(sample_window(2 * n + 5, n, 7), permute(5, n, 7, 2));
}

TEST(SampleOrder, KnownValuesOfThePythonTool) {
  // `tools/data/tessera_data.py order --n 10 --seed 1337` and permute(j, 5, 0, 0) there: the PyTorch
  // reference reads the same batches only if both implementations agree.
  const std::vector<uint64_t> want10 = {1, 8, 9, 5, 6, 3, 4, 2, 0, 7};
  const std::vector<uint64_t> want5 = {3, 2, 1, 0, 4};
  std::vector<uint64_t> got10, got5;
  for (uint64_t j = 0; j < 10; ++j) got10.push_back(permute(j, 10, 1337, 0));
  for (uint64_t j = 0; j < 5; ++j) got5.push_back(permute(j, 5, 0, 0));
  EXPECT_EQ(got10, want10);
  EXPECT_EQ(got5, want5);
}

namespace {
LocalLayout whole(const ModelShape& s) { return make_local_layout(s, 1, 0, 0, s.n_layer, true, true); }
}  // namespace

TEST(Init, PureFunctionOfSeedNameIndex) {
  const ModelShape shape = make_model_shape(2, 2, 16, 8, 50, 16);
  const LocalLayout layout = whole(shape);
  EXPECT_EQ(shape.padded_vocab, 64);
  std::vector<float> a(layout.total), b(layout.total);
  init_local_parameters(a.data(), layout, 42, 0.02);
  init_local_parameters(b.data(), layout, 42, 0.02);
  EXPECT_EQ(a, b);
  // Element by element, in any order, gives the same values (what a shard-generating rank does).
  for (const LocalTensor& t : layout.tensors) {
    for (size_t i = t.numel; i-- > 0;) {
      ASSERT_EQ(init_value(layout.canon(t), shape, 42, 0.02, i), a[t.offset + i])
          << layout.canon(t).name << "[" << i << "]";
    }
  }
  init_local_parameters(b.data(), layout, 43, 0.02);
  EXPECT_NE(a, b);
}

TEST(Shard, TilesAreBlocksOfTheCanonicalModel) {
  // Every tile of a tp = 2, 2-stage split holds exactly the canonical values at its blocks, and
  // the owned tiles cover every canonical element exactly once.
  const ModelShape shape = make_model_shape(4, 4, 16, 8, 50, 16);
  const LocalLayout full = whole(shape);
  std::vector<float> canonical(full.total);
  init_local_parameters(canonical.data(), full, 7, 0.02);
  std::vector<int> covered(full.total, 0);
  for (int stage = 0; stage < 2; ++stage) {
    for (int r = 0; r < 2; ++r) {
      const LocalLayout tile = make_local_layout(shape, 2, r, 2 * stage, 2 * stage + 2, stage == 0,
                                                 stage == 1);
      std::vector<float> local(tile.total);
      init_local_parameters(local.data(), tile, 7, 0.02);
      for (const LocalTensor& t : tile.tensors) {
        const size_t base = full.canonical.tensors[t.canonical].offset;
        for (size_t i = 0; i < t.numel; ++i) {
          const size_t c = tile.canonical_index(t, i);
          ASSERT_EQ(local[t.offset + i], canonical[base + c]) << tile.canon(t).name;
          if (t.owner) covered[base + c] += 1;
        }
      }
      EXPECT_EQ(tile.vocab_rows, 32);
      EXPECT_EQ(tile.vocab_valid(), r == 0 ? 32 : 18);
      const LocalTensor& qkv = tile.tensors[size_t(tile.layer(2 * stage, kQkvW))];
      ASSERT_EQ(qkv.blocks.size(), 3u);  // this rank's heads of q, of k and of v
      EXPECT_EQ(qkv.blocks[1].row0, 16u + 8u * r);
      const LocalTensor& proj = tile.tensors[size_t(tile.layer(2 * stage, kFc2W))];
      EXPECT_EQ(proj.shape, (std::vector<size_t>{16, 32}));  // row-parallel: a column block
    }
  }
  for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << "element " << i;
}

TEST(Init, Gpt2Statistics) {
  const ModelShape shape = make_model_shape(4, 4, 64, 32, 100, 64);
  const ParamLayout layout = make_param_layout(shape);
  std::vector<float> p(layout.total);
  init_local_parameters(p.data(), whole(shape), 1, 0.02);
  auto stats = [&](const std::string& name, size_t first, size_t count) {
    const ParamTensor* t = layout.find(name);
    double s = 0, s2 = 0;
    for (size_t i = first; i < first + count; ++i) {
      s += p[t->offset + i];
      s2 += double(p[t->offset + i]) * p[t->offset + i];
    }
    return std::pair<double, double>(s / count, std::sqrt(s2 / count - (s / count) * (s / count)));
  };
  auto [mean, std] = stats("h.0.mlp.c_fc.weight", 0, 4 * 64 * 64);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std, 0.02, 0.001);
  auto [rmean, rstd] = stats("h.1.attn.c_proj.weight", 0, 64 * 64);
  EXPECT_NEAR(rstd, 0.02 / std::sqrt(8.0), 0.0005);
  (void)rmean;
  // Padded vocabulary rows are zero, real rows are not.
  EXPECT_EQ(stats("wte", 100 * 64, 28 * 64).second, 0.0);
  EXPECT_GT(stats("wte", 0, 100 * 64).second, 0.015);
  for (const ParamTensor& t : layout.tensors) {
    if (t.name.find("ln") != std::string::npos && t.name.ends_with(".weight")) {
      EXPECT_EQ(p[t.offset], 1.0f) << t.name;
    }
    if (t.name.ends_with(".bias")) {
      EXPECT_EQ(p[t.offset], 0.0f) << t.name;
    }
    EXPECT_EQ(t.weight_decay, t.shape.size() == 2) << t.name;
  }
}

TEST(ParamLayout, CountMatchesFormula) {
  const ModelShape s = make_model_shape(12, 12, 768, 1024, 50257, 64);
  const ParamLayout layout = make_param_layout(s);
  const size_t C = 768, L = 12;
  EXPECT_EQ(s.padded_vocab, 50304);
  EXPECT_EQ(layout.total, 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C);
  EXPECT_EQ(layout.tensors[layout.layer(3, kFc1W)].name, "h.3.mlp.c_fc.weight");
  EXPECT_EQ(layout.tensors[size_t(layout.norm_bias)].name, "ln_f.bias");
}

TEST(LrSchedule, WarmupThenCosine) {
  LrSchedule s{1e-3, 1e-4, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_NEAR(s.at(60), 1e-4 + 0.5 * (1e-3 - 1e-4), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
}

TEST(AdamW, MatchesHandComputation) {
  // A decayed weight and an undecayed bias, two steps.
  float p[2] = {0.5f, -0.25f}, m[2] = {0, 0}, v[2] = {0, 0};
  const AdamWHyper h{0.9, 0.95, 1e-8, 0.1};
  double pw = 0.5, pb = -0.25, mw = 0, vw = 0, mb = 0, vb = 0;
  const double grads[2][2] = {{0.3, -0.2}, {-0.1, 0.4}};
  for (int t = 1; t <= 2; ++t) {
    const float g[2] = {float(grads[t - 1][0]), float(grads[t - 1][1])};
    const double lr = 0.01 * t;
    float copy = -1.0f;  // the copy a backend's model may read receives the updated weight
    cpu::adamw_update(p, &copy, g, m, v, 1, true, h, lr, t);
    EXPECT_EQ(copy, p[0]);
    cpu::adamw_update(p + 1, nullptr, g + 1, m + 1, v + 1, 1, false, h, lr, t);
    auto ref = [&](double& x, double& mm, double& vv, double gg, bool decay) {
      if (decay) x *= 1 - lr * h.weight_decay;
      mm = h.beta1 * mm + (1 - h.beta1) * gg;
      vv = h.beta2 * vv + (1 - h.beta2) * gg * gg;
      const double mhat = mm / (1 - std::pow(h.beta1, t)), vhat = vv / (1 - std::pow(h.beta2, t));
      x -= lr * mhat / (std::sqrt(vhat) + h.eps);
    };
    ref(pw, mw, vw, grads[t - 1][0], true);
    ref(pb, mb, vb, grads[t - 1][1], false);
    EXPECT_NEAR(p[0], pw, 1e-7);
    EXPECT_NEAR(p[1], pb, 1e-7);
  }
}

TEST(GradClip, NormAndScale) {
  std::vector<float> g(200001);
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(i % 7) - 3.0f;
  double expect = 0;
  for (float x : g) expect += double(x) * x;
  double acc = 0.0;
  cpu::sum_of_squares(&acc, g.data(), g.size());
  EXPECT_DOUBLE_EQ(acc, expect);
  cpu::sum_of_squares(&acc, g.data(), 7);  // accumulates
  EXPECT_DOUBLE_EQ(acc, expect + 9 + 4 + 1 + 0 + 1 + 4 + 9);
  const double norm = std::sqrt(expect);
  std::vector<float> c = g;
  cpu::scale(c.data(), c.size(), float(clip_factor(norm, 1.0)));
  double clipped = 0.0;
  cpu::sum_of_squares(&clipped, c.data(), c.size());
  EXPECT_NEAR(std::sqrt(clipped), 1.0, 1e-5);
  EXPECT_EQ(clip_factor(norm, 2 * norm), 1.0);  // below the limit: untouched
}
