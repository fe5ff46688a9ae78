#include "backend/peak.hpp"

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
  int reps = 0;
  double elapsed = 0;
  do {
    once();
    ++reps;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < seconds);
  return 2.0 * n * n * double(n) * reps / elapsed / 1e9;
}

}  // namespace tessera
