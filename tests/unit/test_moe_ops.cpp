// The CPU's mixture-of-experts ops (backend/cpu/moe.cpp) against finite differences in double and
// brute force: the router's choice, gates and backward for every rule (softmax or sigmoid,
// renormalised or not, with the auxiliary and z losses), the router's statistics, and the rows
// moved between token and expert order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

double rel_err(double a, double b) {
  return std::fabs(a - b) / std::max(1e-8, std::fabs(a) + std::fabs(b));
}

// The router's loss as the model forms it: Σ w·gates + Σ_e aux[e] Σ_t p[t,e] + z/N Σ_t lse²,
// the choice (hence the auxiliary loss's counts, folded into aux) fixed by the first forward.
struct RouterLoss {
  MoeRouting r;
  int N;
  Vec w, aux;
  double z;
  std::vector<int32_t> chosen;  // the first forward's choice: the FD must not cross a tie

  long double operator()(const Vec& logits) const {
    const int E = r.experts, k = r.top_k;
    std::vector<int32_t> expert(size_t(N) * k);
    Vec gates(size_t(N) * k), scores(size_t(N) * E);
    moe_route_forward<double>(expert.data(), gates.data(), scores.data(), logits.data(), nullptr,
                              N, r);
    EXPECT_EQ(expert, chosen) << "a finite-difference step changed the routing";
    std::vector<double> stats(size_t(E) + 1);
    moe_router_stats<double>(stats.data(), logits.data(), scores.data(), N, r);
    long double L = 0;
    for (size_t i = 0; i < gates.size(); i++) L += (long double)w[i] * gates[i];
    for (int e = 0; e < E; e++) L += (long double)aux[size_t(e)] * stats[size_t(e)];
    return L + (long double)z / N * stats[size_t(E)];
  }
};

void check_router(const MoeRouting& r, int N, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int E = r.experts, k = r.top_k;
  Vec logits = random_vec(size_t(N) * E, rng, -2, 2);
  std::vector<int32_t> expert(size_t(N) * k);
  Vec gates(size_t(N) * k), scores(size_t(N) * E);
  moe_route_forward<double>(expert.data(), gates.data(), scores.data(), logits.data(), nullptr, N,
                            r);
  // The forward against brute force: the k largest scores, in descending order.
  for (int t = 0; t < N; t++) {
    const double* l = logits.data() + size_t(t) * E;
    Vec s(l, l + E);
    if (r.sigmoid) {
      for (double& x : s) x = 1 / (1 + std::exp(-x));
    } else {
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (double& x : s) x /= sum;
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
    double chosen_sum = 0;
    for (int j = 0; j < k; j++) chosen_sum += s[size_t(order[size_t(j)])];
    for (int j = 0; j < k; j++) {
      EXPECT_EQ(expert[size_t(t) * k + j], order[size_t(j)]) << "token " << t << " choice " << j;
      const double want = s[size_t(order[size_t(j)])] / (r.renormalize ? chosen_sum : 1.0);
      EXPECT_NEAR(gates[size_t(t) * k + j], want, 1e-15);
    }
  }
  RouterLoss loss{r, N, random_vec(size_t(N) * k, rng), random_vec(size_t(E), rng), 0.3, expert};
  Vec dlogits(size_t(N) * E, 7.0);  // overwritten
  moe_route_backward<double>(dlogits.data(), loss.w.data(), logits.data(), scores.data(),
                             expert.data(), loss.aux.data(), loss.z, N, r);
  double worst = 0;
  for (size_t i = 0; i < logits.size(); i++) {
    const double x0 = logits[i], h = 1e-6;
    logits[i] = x0 + h;
    const long double lp = loss(logits);
    logits[i] = x0 - h;
    const long double lm = loss(logits);
    logits[i] = x0;
    worst = std::max(worst, rel_err(dlogits[i], double((lp - lm) / (2 * h))));
  }
  EXPECT_LT(worst, 1e-6) << "sigmoid " << r.sigmoid << " renormalize " << r.renormalize;
}

TEST(MoeOps, RouterForwardAndBackwardForEveryRule) {
  uint64_t seed = 1;
  for (bool sigmoid : {false, true})
    for (bool renormalize : {false, true}) {
      check_router({6, 2, sigmoid, renormalize}, 5, seed++);
      check_router({8, 3, sigmoid, renormalize}, 4, seed++);
      check_router({4, 1, sigmoid, renormalize}, 3, seed++);
    }
}

// Equal keys go to the lower expert index, and the bias moves the choice but not the gates.
TEST(MoeOps, TiesGoToTheLowerIndexAndTheBiasOnlyChooses) {
  const MoeRouting r{4, 2, false, false};
  const double logits[] = {0.5, 1.0, 1.0, 1.0};
  int32_t expert[2];
  double gates[2], scores[4];
  moe_route_forward<double>(expert, gates, scores, logits, nullptr, 1, r);
  EXPECT_EQ(expert[0], 1);
  EXPECT_EQ(expert[1], 2);
  const float bias[] = {1.0f, 0.0f, 0.0f, 0.0f};  // expert 0 now first by its biased key
  moe_route_forward<double>(expert, gates, scores, logits, bias, 1, r);
  EXPECT_EQ(expert[0], 0);
  EXPECT_EQ(expert[1], 1);
  EXPECT_DOUBLE_EQ(gates[0], scores[0]);  // the unbiased score
  EXPECT_LT(gates[0], gates[1]);
}

TEST(MoeOps, RouterStatsAreTheLossesSums) {
  std::mt19937_64 rng(11);
  for (bool sigmoid : {false, true}) {
    const MoeRouting r{5, 2, sigmoid, true};
    const int N = 7, E = 5;
    const Vec logits = random_vec(size_t(N) * E, rng, -3, 3);
    std::vector<int32_t> expert(size_t(N) * 2);
    Vec gates(size_t(N) * 2), scores(size_t(N) * E);
    moe_route_forward<double>(expert.data(), gates.data(), scores.data(), logits.data(), nullptr,
                              N, r);
    std::vector<double> stats(size_t(E) + 1);
    moe_router_stats<double>(stats.data(), logits.data(), scores.data(), N, r);
    double total = 0, z = 0;
    for (int e = 0; e < E; e++) total += stats[size_t(e)];
    EXPECT_NEAR(total, N, 1e-12);  // p sums to one per token
    for (int t = 0; t < N; t++) {
      double sum = 0;
      for (int e = 0; e < E; e++) sum += std::exp(logits[size_t(t) * E + e]);
      z += std::log(sum) * std::log(sum);
    }
    EXPECT_NEAR(stats[size_t(E)], z, 1e-12 * z);
  }
}

// N tokens, k choices, C columns; slot_of a permutation of the slots with some dropped.
TEST(MoeOps, CombineGathersAndTheirBackwardAgainstFiniteDifferences) {
  std::mt19937_64 rng(5);
  const int N = 4, k = 2, C = 3, slots = N * k;
  std::vector<int32_t> slot_of(static_cast<size_t>(slots));
  std::iota(slot_of.begin(), slot_of.end(), 0);
  std::shuffle(slot_of.begin(), slot_of.end(), rng);
  slot_of[3] = -1;  // a choice the capacity dropped
  Vec rows = random_vec(size_t(slots) * C, rng), gates = random_vec(size_t(slots), rng);
  const Vec w = random_vec(size_t(N) * C, rng);
  auto loss = [&] {
    Vec out(size_t(N) * C, 9.0);
    moe_combine<double>(out.data(), rows.data(), slot_of.data(), gates.data(), N, k, C, false);
    long double L = 0;
    for (size_t i = 0; i < out.size(); i++) L += (long double)w[i] * out[i];
    return L;
  };
  Vec drows(size_t(slots) * C, 0.0), dgates(size_t(slots), 5.0);
  moe_combine_backward<double>(drows.data(), dgates.data(), w.data(), rows.data(), slot_of.data(),
                               gates.data(), N, k, C);
  EXPECT_EQ(dgates[3], 0.0);
  auto fd = [&](Vec& x, const Vec& grad) {
    double worst = 0;
    for (size_t i = 0; i < x.size(); i++) {
      const double x0 = x[i], h = 1e-6;
      x[i] = x0 + h;
      const long double lp = loss();
      x[i] = x0 - h;
      const long double lm = loss();
      x[i] = x0;
      worst = std::max(worst, rel_err(grad[i], double((lp - lm) / (2 * h))));
    }
    return worst;
  };
  EXPECT_LT(fd(rows, drows), 1e-7);
  EXPECT_LT(fd(gates, dgates), 1e-7);
  // The gather's backward is combine with unit gates, accumulated: <gather(x), y> = <x, back(y)>.
  std::vector<int32_t> token_of(size_t(slots), 0);
  for (int t = 0; t < N; t++)
    for (int j = 0; j < k; j++)
      if (slot_of[size_t(t) * k + j] >= 0) token_of[size_t(slot_of[size_t(t) * k + j])] = t;
  const Vec x = random_vec(size_t(N) * C, rng), y = random_vec(size_t(slots) * C, rng);
  Vec gathered(size_t(slots) * C, 0.0), back(size_t(N) * C, 0.0);
  moe_gather_rows<double>(gathered.data(), x.data(), token_of.data(), slots, C);
  moe_combine<double>(back.data(), y.data(), slot_of.data(), nullptr, N, k, C, true);
  double lhs = 0, rhs = 0;
  for (int p = 0; p < slots; p++) {
    const bool live = std::find(slot_of.begin(), slot_of.end(), p) != slot_of.end();
    for (int c = 0; c < C; c++) lhs += live ? gathered[size_t(p) * C + c] * y[size_t(p) * C + c] : 0;
  }
  for (size_t i = 0; i < x.size(); i++) rhs += x[i] * back[i];
  EXPECT_NEAR(lhs, rhs, 1e-12);
}

}  // namespace
}  // namespace tessera::cpu
