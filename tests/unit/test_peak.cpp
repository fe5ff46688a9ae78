// The probes `tessera plan --machine cpu` times this machine with (backend/peak.cpp) against the
// same operations timed here directly: a probe that measured something else (a wrong shape, a
// per-element rate divided by the wrong count, the wrong thread count) is off by far more than
// the factor of two these allow for a shared machine and for the probe's cold caches (it evicts
// them before each repetition, as a step's other ops do; the direct timing here runs warm).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "backend/peak.hpp"
#include "backend/adamw.hpp"

using namespace tessera;

namespace {

template <class F>
double fastest(F&& once, int reps) {
  once();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Up to five rounds of (probe, direct) timings, the first whose ratio is within a factor of two
// ending them: other processes' load can set one round's two timings apart by more than that,
// while a probe that measures something else is off by more in every round. The pair returned is
// that round's, or the last's.
template <class Round>
std::pair<double, double> within_two(Round round) {
  std::pair<double, double> r;
  for (int k = 0; k < 5; ++k) {
    r = round();
    if (r.first > r.second / 2 && r.first < r.second * 2) break;
  }
  return r;
}

}  // namespace

TEST(Peak, SgemmSecondsAtAShapeMatchesTheProductTimedDirectly) {
  // The attention-projection shape of a GPT-2 124M layer at 256 tokens: C(256,2304) = A B^T.
  const int M = 256, N = 2304, K = 768;
  std::vector<float> a(size_t(M) * K, 0.5f), b(size_t(N) * K, 0.25f), c(size_t(M) * N);
  const auto [probe, direct] = within_two([&] {
    const double d = fastest([&] {
      cpu::gemm<float>(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    }, 5);
    return std::make_pair(measure_sgemm_seconds(false, true, M, N, K, false), d);
  });
  EXPECT_GT(probe, direct / 2) << "probe " << probe << " s, direct " << direct << " s";
  EXPECT_LT(probe, direct * 2) << "probe " << probe << " s, direct " << direct << " s";
  // Past 1024 a dimension is measured at 1024 and the time scaled by the ratio.
  EXPECT_DOUBLE_EQ(measure_sgemm_seconds(false, true, 4 * 1024, 512, 512, false),
                   4 * measure_sgemm_seconds(false, true, 1024, 512, 512, false));
}

TEST(Peak, OptimizerRatesMatchThePassesTimedDirectly) {
  const size_t n = size_t(1) << 22;
  std::vector<float> p(n, 0.5f), g(n, 0.25f), m(n, 0.0f), v(n, 0.0f);
  const AdamWHyper hyper;
  long t = 0;
  const int threads = omp_get_max_threads();
  OptimizerRates rates;
  const auto [adamw_probe, adamw] = within_two([&] {
    const double d = fastest([&] {
      cpu::adamw_update(p.data(), nullptr, g.data(), m.data(), v.data(), n, true, hyper, 1e-4, ++t);
    }, 5) / double(n);
    rates = measure_optimizer_rates(1);
    return std::make_pair(rates.adamw, d);
  });
  double sum = 0;
  const auto [norm_probe, norm] = within_two([&] {
    const double d = fastest([&] { cpu::sum_of_squares(&sum, g.data(), n); }, 5) / double(n);
    rates = measure_optimizer_rates(1);
    return std::make_pair(rates.norm, d);
  });
  EXPECT_GT(adamw_probe, adamw / 2) << "probe " << adamw_probe << " s/element, direct " << adamw;
  EXPECT_LT(adamw_probe, adamw * 2) << "probe " << adamw_probe << " s/element, direct " << adamw;
  EXPECT_GT(norm_probe, norm / 2) << "probe " << norm_probe << " s/element, direct " << norm;
  EXPECT_LT(norm_probe, norm * 2) << "probe " << norm_probe << " s/element, direct " << norm;
  EXPECT_GT(rates.scale, 0.0);
  EXPECT_GT(rates.zero, 0.0);
  // The probe leaves the caller's thread count as it found it, also when it ran more threads for
  // the ranks beside this one.
  EXPECT_EQ(omp_get_max_threads(), threads);
  measure_optimizer_rates(3);
  EXPECT_EQ(omp_get_max_threads(), threads);
}
