#include "plan/compute.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

double gemm_seconds(const ComputeModel& c, double M, double N, double K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  auto tiles = [&](double d) { return c.gemm_tile > 0 ? std::ceil(d / c.gemm_tile) * c.gemm_tile : d; };
  // Above the tile, a GEMM whose smallest dimension is short runs further from its peak (fewer
  // tiles to fill the SMs, a short K loop beside each tile's prologue and epilogue).
  const double least = std::min({M, N, K});
  const double shape = c.gemm_half > 0 ? least / (least + c.gemm_half) : 1.0;
  const double eff = std::min(1.0, c.gemm_efficiency * shape);
  const double flops = 2 * tiles(M) * tiles(N) * K / (c.peak * eff);
  const double bytes = stream_seconds(c, c.element_bytes * (M * K + K * N + M * N));
  return std::max(flops, bytes);
}

double stream_seconds(const ComputeModel& c, double bytes) {
  return bytes / (c.memory_bw * c.memory_efficiency);
}

}  // namespace tessera
