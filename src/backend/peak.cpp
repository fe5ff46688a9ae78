#include "backend/peak.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera {

namespace {

// The fastest of at least `min_reps` runs of once() and `seconds` of them, after a warm-up run
// (thread pool start and page faults are no part of a rate): a peak is what the machine can do,
// and slower repetitions measure whatever else ran on the cores meanwhile.
template <class F>
double fastest_seconds(F&& once, double seconds, int min_reps = 1,
                       const std::function<void()>& before = {}) {
  once();
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double best = 1e30;
  int reps = 0;
  do {
    if (before) before();
    const auto t0 = clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  } while (++reps < min_reps ||
           std::chrono::duration<double>(clock::now() - start).count() < seconds);
  return best;
}

// Writes a buffer twice the size of the last-level cache, so that what a probe reads next comes
// from memory.
void evict_caches() {
  static std::vector<char> sweep;
  if (sweep.empty()) {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    sweep.resize(size_t(2 * std::max(llc, 32L << 20)));
  }
  const size_t n = sweep.size();
  char* p = sweep.data();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += 64) p[i] = char(i);
}

}  // namespace

double measure_sgemm_gflops(double seconds) {
  constexpr int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
  auto once = [&] { cpu::gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                     c.data(), n); };
  const double best = fastest_seconds(once, seconds);
  return 2.0 * n * n * double(n) / best / 1e9;
}

double measure_copy_bandwidth(double seconds) {
  const size_t n = size_t(16) << 20;  // floats: 64 MB, beyond any cache
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  auto once = [&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
  };
  const double best = fastest_seconds(once, seconds);
  return 2.0 * double(n) * sizeof(float) / best;
}

double measure_sgemm_seconds(bool trans_a, bool trans_b, int M, int N, int K, bool per_thread) {
  constexpr int kClamp = 1024;
  const int m = std::min(M, kClamp), n = std::min(N, kClamp), k = std::min(K, kClamp);
  const double scale = double(M) / m * (double(N) / n) * (double(K) / k);
  static std::mutex lock;
  static std::map<std::tuple<bool, bool, int, int, int, bool, int>, double> cache;
  const int threads = omp_get_max_threads();
  const auto key = std::make_tuple(trans_a, trans_b, m, n, k, per_thread, threads);
  {
    std::lock_guard<std::mutex> hold(lock);
    if (auto it = cache.find(key); it != cache.end()) return it->second * scale;
  }
  const int copies = per_thread ? threads : 1;
  const size_t a_size = size_t(m) * k, b_size = size_t(k) * n, c_size = size_t(m) * n;
  std::vector<float> a(a_size * copies, 0.5f), b(b_size * copies, 0.25f), c(c_size * copies, 0.0f);
  // Leading dimensions as stored: row-major op(A) (M,K) is A (K,M) when transposed.
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  // Per thread, each thread runs `inner` products back to back inside one parallel region, as
  // the attention's loop does: a region per tiny product would time the fork and join instead.
  const int inner = per_thread ? int(std::clamp(1e8 / (2.0 * m * n * k), 1.0, 1000.0)) : 1;
  auto once = [&] {
    if (!per_thread) {
      cpu::gemm<float>(trans_a, trans_b, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                       c.data(), n);
      return;
    }
#pragma omp parallel
    {
      const size_t t = size_t(omp_get_thread_num());
      for (int r = 0; r < inner; ++r)
        cpu::gemm<float>(trans_a, trans_b, m, n, k, 1.0f, a.data() + t * a_size, lda,
                         b.data() + t * b_size, ldb, 0.0f, c.data() + t * c_size, n);
    }
  };
  // The fastest of at least 3 repetitions and 100 ms: on a shared machine most repetitions
  // measure what else ran meanwhile. Each starts with the operands out of the caches, as in a
  // step, where the ops between two products of a layer sweep other memory.
  const double best = fastest_seconds(once, 0.1, 3, evict_caches) / inner;
  std::lock_guard<std::mutex> hold(lock);
  cache[key] = best;
  return best * scale;
}

double measure_exp_rate(double seconds) {
  const size_t n = size_t(1) << 20;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = -float(i % 1000) * 0.01f;
  auto once = [&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = std::exp(a[i] - 1.0f);
  };
  const double best = fastest_seconds(once, seconds);
  return double(n) / best;
}

OptimizerRates measure_optimizer_rates(int sharing) {
  const int threads = omp_get_max_threads();
  sharing = std::max(1, sharing);
  // 4 Mi elements a rank: its four buffers (64 MB) are beyond any cache, as a model's are.
  const size_t per_rank = size_t(1) << 22, n = per_rank * size_t(sharing);
  std::vector<float> p(n, 0.5f), g(n, 0.25f), m(n, 0.0f), v(n, 0.0f);
  omp_set_num_threads(threads * sharing);
  OptimizerRates r;
  long t = 0;
  const AdamWHyper hyper;
  auto per_element = [&](auto&& once) { return fastest_seconds(once, 0.05, 3) / double(per_rank); };
  r.adamw = per_element([&] { cpu::adamw_update(p.data(), nullptr, g.data(), m.data(), v.data(), n,
                                                true, hyper, 1e-4, ++t); });
  double sum = 0;
  r.norm = per_element([&] { cpu::sum_of_squares(&sum, g.data(), n); });
  r.scale = per_element([&] { cpu::scale(g.data(), n, 1.0f); });
  // Zeroing is one memset on the rank's own thread; the other ranks' memsets run meanwhile.
  r.zero = per_element([&] {
#pragma omp parallel for schedule(static) num_threads(sharing)
    for (int k = 0; k < sharing; ++k) cpu::zero(m.data() + size_t(k) * per_rank, per_rank * sizeof(float));
  });
  omp_set_num_threads(threads);
  return r;
}

}  // namespace tessera
