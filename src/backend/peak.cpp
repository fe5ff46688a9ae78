#include "backend/peak.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera {

double measure_sgemm_gflops(double seconds) {
  constexpr int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
  auto once = [&] { cpu::gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                     c.data(), n); };
  once();  // warm-up: thread pool start and page faults are no part of the rate
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  // The fastest repetition: a peak is what the machine can do, and slower repetitions measure
  // whatever else ran on the cores meanwhile.
  double best = 1e30;
  do {
    const auto t0 = clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  } while (std::chrono::duration<double>(clock::now() - start).count() < seconds);
  return 2.0 * n * n * double(n) / best / 1e9;
}

double measure_copy_bandwidth(double seconds) {
  const size_t n = size_t(16) << 20;  // floats: 64 MB, beyond any cache
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  auto once = [&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
  };
  once();
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double best = 1e30;
  do {
    const auto t0 = clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  } while (std::chrono::duration<double>(clock::now() - start).count() < seconds);
  return 2.0 * double(n) * sizeof(float) / best;
}

}  // namespace tessera
