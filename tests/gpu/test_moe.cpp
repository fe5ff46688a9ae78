// The CUDA mixture-of-experts ops (backend/cuda/moe.cu, the experts' GEMMs of matmul.cu) against
// their CPU twins in double on the very values the device holds (tests/gpu/test_ops.cpp's measure
// and bounds): every router rule, the router's statistics, the rows moved between token and
// expert order, dropped choices included, and the experts' linear layers, looped and grouped.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "device/context.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

namespace cpu = tessera::cpu;
namespace gpu = tessera::cuda;

std::vector<int32_t> fetch_ints(const int32_t* p, size_t n) {
  sync();
  std::vector<int32_t> out(n);
  ck(cudaMemcpy(out.data(), p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

// Logits whose scores are far apart in every row (a shuffled ladder with a little noise), so
// that fp32 and double choose the same experts.
template <typename F>
std::vector<double> ladder_logits(int N, int E, std::mt19937_64& gen) {
  std::vector<double> out(size_t(N) * E);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  std::vector<int> order(static_cast<size_t>(E));
  for (int t = 0; t < N; t++) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    for (int e = 0; e < E; e++)
      out[size_t(t) * E + e] = round_to<F>(-2.0 + 4.0 * order[size_t(e)] / E + noise(gen));
  }
  return out;
}

template <typename F>
class CudaMoe : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CudaMoe, Types, TypeNames);

TYPED_TEST(CudaMoe, RouterEveryRule) {
  using F = TypeParam;
  std::mt19937_64 gen(17);
  const int N = 70, E = 8, k = 2;
  for (bool sigmoid : {false, true})
    for (bool renormalize : {false, true}) {
      const MoeRouting r{E, k, sigmoid, renormalize};
      const std::string what = std::string(sigmoid ? " sigmoid" : " softmax") +
                               (renormalize ? " renormalised" : "");
      const std::vector<double> logits = ladder_logits<F>(N, E, gen);
      std::vector<double> bias_d(static_cast<size_t>(E));
      for (int e = 0; e < E; e++) bias_d[size_t(e)] = e % 3 == 0 ? 0.2 : 0.0;
      const std::vector<float> bias(bias_d.begin(), bias_d.end());
      Dev<F> d_logits(logits);
      Dev<float> d_bias(bias_d), d_gates(size_t(N) * k), d_scores(size_t(N) * E),
          d_expert(size_t(N) * k);
      int32_t* d_chosen = reinterpret_cast<int32_t*>(d_expert.get());
      gpu::moe_route_forward<F>(d_chosen, d_gates, d_scores, d_logits, d_bias, N, r);
      std::vector<int32_t> expert(size_t(N) * k);
      std::vector<double> gates(size_t(N) * k), scores(size_t(N) * E);
      cpu::moe_route_forward<double>(expert.data(), gates.data(), scores.data(), logits.data(),
                                     bias.data(), N, r);
      EXPECT_EQ(fetch_ints(d_chosen, expert.size()), expert) << "the choice" << what;
      EXPECT_CLOSE(d_scores.fetch(), scores, tolerance<float>(), "scores" + what);
      EXPECT_CLOSE(d_gates.fetch(), gates, tolerance<float>(), "gates" + what);

      const std::vector<double> dgates = random_of<float>(size_t(N) * k);
      const std::vector<double> aux = random_of<float>(size_t(E));
      Dev<float> d_dgates(dgates), d_aux(aux);
      Dev<F> d_dlogits(size_t(N) * E);
      std::vector<double> dlogits(size_t(N) * E);
      // The reference reads the device's fp32 scores, so the error measured is the backward's.
      const std::vector<double> device_scores = d_scores.fetch();
      gpu::moe_route_backward<F>(d_dlogits, d_dgates, d_logits, d_scores, d_chosen, d_aux, 0.3,
                                 N, r);
      cpu::moe_route_backward<double>(dlogits.data(), dgates.data(), logits.data(),
                                      device_scores.data(), expert.data(), aux.data(), 0.3, N, r);
      EXPECT_CLOSE(d_dlogits.fetch(), dlogits, tolerance<F>(), "moe_route_backward" + what);

      Dev<double> d_stats(size_t(E) + 1);
      std::vector<double> stats(size_t(E) + 1);
      gpu::moe_router_stats<F>(d_stats, d_logits, d_scores, N, r);
      cpu::moe_router_stats<double>(stats.data(), logits.data(), device_scores.data(), N, r);
      EXPECT_CLOSE(d_stats.fetch(), stats, tolerance<float>(), "moe_router_stats" + what);
    }
}

// C = 64 and 67 (a warp's tail); one choice dropped.
TYPED_TEST(CudaMoe, RowsBetweenTokenAndExpertOrder) {
  using F = TypeParam;
  std::mt19937_64 gen(23);
  const int N = 37, k = 3, slots = N * k;
  for (int C : {64, 67}) {
    const std::string what = " C=" + std::to_string(C);
    std::vector<int32_t> slot_of(static_cast<size_t>(slots));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    std::shuffle(slot_of.begin(), slot_of.end(), gen);
    slot_of[5] = -1;
    std::vector<int32_t> token_of(size_t(slots), 0);
    for (int t = 0; t < N; t++)
      for (int j = 0; j < k; j++)
        if (const int32_t s = slot_of[size_t(t) * k + j]; s >= 0) token_of[size_t(s)] = t;
    const std::vector<double> x = random_of<F>(size_t(N) * C), rows = random_of<F>(size_t(slots) * C);
    const std::vector<double> gates = random_of<float>(size_t(slots));
    DevInts d_slot_of(slot_of), d_token_of(token_of);
    Dev<F> d_x(x), d_rows(rows), d_gathered(size_t(slots) * C), d_out(size_t(N) * C);
    Dev<float> d_gates(gates);

    std::vector<double> gathered(size_t(slots) * C), out(size_t(N) * C);
    gpu::moe_gather_rows<F>(d_gathered, d_x, d_token_of, slots, C);
    cpu::moe_gather_rows<double>(gathered.data(), x.data(), token_of.data(), slots, C);
    EXPECT_CLOSE(d_gathered.fetch(), gathered, 0.0, "moe_gather_rows" + what);

    gpu::moe_combine<F>(d_out, d_rows, d_slot_of, d_gates, N, k, C, false);
    cpu::moe_combine<double>(out.data(), rows.data(), slot_of.data(), gates.data(), N, k, C, false);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "moe_combine" + what);
    // Accumulated, with unit gates: the gather's backward.
    const std::vector<double> acc = random_of<F>(size_t(N) * C);
    std::vector<double> want = acc;
    d_out.put(acc);
    gpu::moe_combine<F>(d_out, d_rows, d_slot_of, nullptr, N, k, C, true);
    cpu::moe_combine<double>(want.data(), rows.data(), slot_of.data(), nullptr, N, k, C, true);
    EXPECT_CLOSE(d_out.fetch(), want, tolerance<F>(), "moe_combine accumulated" + what);

    const std::vector<double> dout = random_of<F>(size_t(N) * C);
    Dev<F> d_dout(dout), d_drows(size_t(slots) * C);
    Dev<float> d_dgates(static_cast<size_t>(slots));
    std::vector<double> drows(size_t(slots) * C, 0.0), dgates(static_cast<size_t>(slots));
    gpu::moe_combine_backward<F>(d_drows, d_dgates, d_dout, d_rows, d_slot_of, d_gates, N, k, C);
    cpu::moe_combine_backward<double>(drows.data(), dgates.data(), dout.data(), rows.data(),
                                      slot_of.data(), gates.data(), N, k, C);
    // The dropped choice's slot has no row: compare the live ones.
    std::vector<double> got = d_drows.fetch();
    for (int s = 0; s < slots; s++)
      if (std::find(slot_of.begin(), slot_of.end(), s) == slot_of.end())
        for (int c = 0; c < C; c++) got[size_t(s) * C + c] = drows[size_t(s) * C + c] = 0;
    EXPECT_CLOSE(got, drows, tolerance<F>(), "moe_combine_backward rows" + what);
    EXPECT_CLOSE(d_dgates.fetch(), dgates, tolerance<F>(), "moe_combine_backward gates" + what);
  }
}

// The held experts' linear layers, each on its block of rows, one cuBLAS GEMM per expert and
// grouped (device.expert_gemm), against the CPU's per-expert matmuls in double: an expert without
// rows, biases and none, and 130 experts with rows (two grouped calls of at most 128 products).
TYPED_TEST(CudaMoe, ExpertsLoopAndGroupedAgainstCpu) {
  using F = TypeParam;
  struct Case {
    std::vector<int> counts;
    int IC, OC;
  };
  std::vector<Case> cases = {{{7, 0, 13, 1, 9}, 24, 40}, {{}, 8, 6}};
  std::uniform_int_distribution<int> rows(1, 3);
  for (int e = 0; e < 130; e++) cases[1].counts.push_back(rows(rng()));
  for (const Case& c : cases) {
    const int held = int(c.counts.size()), IC = c.IC, OC = c.OC;
    std::vector<int> offsets(size_t(held) + 1, 0);
    for (int e = 0; e < held; e++) offsets[size_t(e) + 1] = offsets[size_t(e)] + c.counts[size_t(e)];
    const size_t R = size_t(offsets.back()), W = size_t(held) * OC * IC;
    const auto inp = random_of<F>(R * IC), w = random_of<F>(W), bias = random_of<F>(size_t(held) * OC);
    const auto dout = random_of<F>(R * OC);
    Dev<F> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout);
    for (bool grouped : {false, true}) {
      device::set_grouped_experts(grouped);
      const long calls = gpu::grouped_gemm_calls();
      for (bool with_bias : {true, false}) {
        const std::string what = std::string(grouped ? " grouped" : " loop") +
                                 (with_bias ? " bias" : "") + " held=" + std::to_string(held);
        Dev<F> d_out(R * OC);
        std::vector<double> out(R * OC);
        gpu::experts_forward<F>(d_out, d_inp, d_w, with_bias ? d_bias.get() : nullptr,
                                c.counts.data(), offsets.data(), held, IC, OC);
        cpu::experts_forward<double>(out.data(), inp.data(), w.data(),
                                     with_bias ? bias.data() : nullptr, c.counts.data(),
                                     offsets.data(), held, IC, OC);
        EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "experts_forward" + what);

        auto dinp = random_of<F>(R * IC);
        auto dw = random_of<float>(W), db = random_of<float>(size_t(held) * OC);
        Dev<F> d_dinp(dinp);
        Dev<float> d_dw(dw), d_db(db);
        gpu::experts_backward<F>(d_dinp, d_dw, with_bias ? d_db.get() : nullptr, d_dout, d_inp,
                                 d_w, c.counts.data(), offsets.data(), held, IC, OC);
        cpu::experts_backward<double>(dinp.data(), dw.data(), with_bias ? db.data() : nullptr,
                                      dout.data(), inp.data(), w.data(), c.counts.data(),
                                      offsets.data(), held, IC, OC);
        EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "experts_backward dinp" + what);
        EXPECT_CLOSE(d_dw.fetch(), dw, tolerance<F>(), "experts_backward dweight" + what);
        EXPECT_CLOSE(d_db.fetch(), db, tolerance<F>(), "experts_backward dbias" + what);
      }
      // Twice (bias, none): the forward and the input gradient grouped, and in fp32 the weight
      // gradient; 130 experts take two calls of at most 128 each.
      const long busy = held - long(std::count(c.counts.begin(), c.counts.end(), 0));
      const long per_call = (busy + 127) / 128, products = sizeof(F) == 4 ? 3 : 2;
      EXPECT_EQ(gpu::grouped_gemm_calls() - calls, grouped ? 2 * products * per_call : 0)
          << "cublasGemmGroupedBatchedEx calls, held=" << held;
    }
    device::set_grouped_experts(false);
  }
}

}  // namespace
}  // namespace tessera::gpu_test
