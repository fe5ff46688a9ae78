// The anomaly policy: the detector's verdicts, and a dropped update that leaves the parameters,
// the optimizer's state and its step count exactly as they were (AdamW and Adafactor, with and
// without ZeRO-1).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/shard.hpp"
#include "pipeline/schedule.hpp"
#include "train/anomaly.hpp"
#include "train/anomaly_policy.hpp"
#include "engine/engine.hpp"
#include "parallel/layout.hpp"

using namespace tessera;

TEST(Anomaly, NonFiniteIsAlwaysAnomalous) {
  const AnomalyDetector off(5, 0.0);  // sigma 0: spikes are not looked for
  EXPECT_EQ(off.judge(3.0, 1.0), "");
  EXPECT_EQ(off.judge(NAN, 1.0), "loss nan is not finite");
  EXPECT_EQ(off.judge(3.0, INFINITY), "grad_norm inf is not finite");
  EXPECT_EQ(off.judge(-INFINITY, 1.0), "loss -inf is not finite");
  EXPECT_EQ(off.judge(3.0, 1e30), "");
}

TEST(Anomaly, SpikesAgainstAFullWindow) {
  AnomalyDetector d(4, 3.0);
  // Not judged until the window is full.
  for (double x : {4.0, 4.2, 3.8}) {
    EXPECT_EQ(d.judge(100.0, 100.0), "");
    d.accept(x, 1.0 + (x - 4.0));
  }
  d.accept(4.0, 1.0);  // window: loss 4, 4.2, 3.8, 4 (mean 4, std 0.1414); norm mean 1
  EXPECT_EQ(d.judge(4.4, 1.0), "");  // mean + 3 std = 4.424
  EXPECT_EQ(d.judge(4.43, 1.0),
            "loss 4.43 is above the mean 4 + 3 x std 0.141421 of the last 4 steps");
  EXPECT_NE(d.judge(4.0, 2.0).find("grad_norm 2 is above the mean 1 + 3 x std"), std::string::npos);
  // The window slides: four larger losses make 4.43 normal.
  for (int i = 0; i < 4; ++i) d.accept(4.4 + 0.05 * i, 1.0);
  EXPECT_EQ(d.judge(4.43, 1.0), "");
}

namespace {

// Two engines of one small model on this rank; B = 2 sequences of T = 8.
struct Pair {
  ModelShape shape = make_model_shape(2, 2, 16, 8, 40, 8);
  LocalLayout tile = make_local_layout(shape, 1, 0, 0, shape.n_layer, true, true);
  Mesh mesh{MPI_COMM_SELF, mesh_shape(ParallelLayout{1, 1, 1})};
  std::unique_ptr<TrainEngine> a, b;
  Pair(bool zero, OptimRule rule) {
    EngineSetup setup{.tile = tile,
                            .mesh = &mesh,
                            .schedule = make_schedule(ScheduleKind::OneFOneB, 0, 1, 1),
                            .micro_batch = 2,
                            .seq_len = 8,
                            .n_micro = 1,
                            .zero = zero ? 1 : 0,
                            .hyper = AdamWHyper{0.9, 0.95, 1e-8, 0.1}};
    setup.hyper.rule = rule;
    a = make_engine(setup, EngineKind::cpu);
    b = make_engine(setup, EngineKind::cpu);
    for (TrainEngine* e : {a.get(), b.get()}) {
      init_local_parameters(e->host_params(), tile, 11, 0.02);
      e->params_to_device();
    }
  }
};

std::vector<int32_t> tokens(int seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::vector<int32_t> t(2 * 8 + 1);
  for (int32_t& x : t) x = int32_t(gen() % 40);
  return t;
}

void expect_same_state(TrainEngine& a, TrainEngine& b) {
  const size_t n = a.state_size();
  const float* pa = a.params_to_host();
  const float* pb = b.params_to_host();
  EXPECT_EQ(std::vector<float>(pa, pa + n), std::vector<float>(pb, pb + n));
  std::vector<std::vector<float>> sa, sb;
  a.get_optim_state(sa);
  b.get_optim_state(sb);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(sa.size(), a.optim_state().size());
}

}  // namespace

// Engine a: step 1, a step whose update is dropped (NaN gradients), step 2. Engine b: step 1,
// step 2. Every parameter and state value equal to the bit: the dropped update left nothing
// behind, and step 2 saw the rule's t = 2 in both.
TEST(Anomaly, DroppedUpdateLeavesNothingBehind) {
  for (OptimRule rule : {OptimRule::AdamW, OptimRule::Adafactor})
  for (bool zero : {false, true}) {
    Pair p(zero, rule);
    const std::vector<int32_t> t1 = tokens(1), t2 = tokens(2), bad = tokens(3);
    auto batch = [](const std::vector<int32_t>& t) {
      return std::vector<HostMicroBatch>{{t.data(), t.data() + 1}};
    };
    const float dloss = 1.0f / 16;
    int checked = 0;
    const TrainEngine::StepCheck yes = [&](double, double, double) { return ++checked > 0; };
    const TrainEngine::StepCheck no = [&](double loss, double norm, double) {
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_TRUE(std::isnan(norm));
      return false;
    };
    p.a->train_step(batch(t1), dloss, 1.0, 1e-2, 1, yes);
    p.b->train_step(batch(t1), dloss, 1.0, 1e-2, 1);
    expect_same_state(*p.a, *p.b);
    const TrainEngine::StepResult dropped = p.a->train_step(batch(bad), NAN, 1.0, 1e-2, 2, no);
    EXPECT_TRUE(std::isnan(dropped.norm));
    expect_same_state(*p.a, *p.b);
    p.a->train_step(batch(t2), dloss, 1.0, 1e-2, 2, yes);
    p.b->train_step(batch(t2), dloss, 1.0, 1e-2, 2);
    expect_same_state(*p.a, *p.b);
    EXPECT_EQ(checked, 2);
  }
}

// Rollbacks to the same checkpoint skip overlapping ranges of global samples: each skipped
// sample is counted once (the sum of the ranges claimed 8 + 12 + 20 = 40 for 20 distinct ones).
TEST(AnomalyPolicy, SkippedSamplesCountEachSampleOnce) {
  TrainConfig train;
  train.anomaly_action = AnomalyAction::Rollback;
  train.anomaly_max_rollbacks = 100;
  AnomalyPolicy policy(train);
  int64_t ckpt_from = 100;
  auto roll = [&] { return AnomalyPolicy::Rolled{"step_5.h5", 5, ckpt_from}; };
  const std::string none = "/nonexistent-tessera-dir";
  policy.meet(104, 108, none, roll);  // [100, 108)
  EXPECT_EQ(policy.skipped_samples(), 8);
  policy.meet(108, 112, none, roll);  // [100, 112): 4 new
  EXPECT_EQ(policy.skipped_samples(), 12);
  policy.meet(116, 120, none, roll);  // [100, 120): 8 new
  EXPECT_EQ(policy.skipped_samples(), 20);
  ckpt_from = 200;                    // a later checkpoint: [200, 204) apart
  policy.meet(200, 204, none, roll);
  EXPECT_EQ(policy.skipped_samples(), 24);
  ckpt_from = 90;                     // one range covering both and more: [90, 210)
  policy.meet(206, 210, none, roll);
  EXPECT_EQ(policy.skipped_samples(), 120);
  EXPECT_EQ(policy.rollbacks(), 5);
}
