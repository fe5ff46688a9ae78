// The planner's shape-aware compute model (plan/compute.hpp) on hand-computed cases: an A100-like
// device, 312 TFLOP/s bf16 at 0.76 of peak, 2039 GB/s at 0.7, 128-wide tiles.
#include <gtest/gtest.h>

#include "plan/compute.hpp"

using namespace tessera;

namespace {

ComputeModel a100() {
  ComputeModel c;
  c.peak = 312e12;
  c.gemm_efficiency = 0.76;
  c.gemm_tile = 128;
  c.memory_bw = 2039e9;
  c.memory_efficiency = 0.7;
  c.element_bytes = 2;
  return c;
}

}  // namespace

TEST(Compute, LargeAlignedGemmAtItsEfficiency) {
  // 8192^3: 2 * 8192^3 FLOPs at 0.76 * 312 TFLOP/s; its 3 * 8192^2 * 2 bytes take far less.
  const double n = 8192;
  EXPECT_NEAR(gemm_seconds(a100(), n, n, n), 2 * n * n * n / (0.76 * 312e12), 1e-12);
}

TEST(Compute, TileQuantizationChargesWholeTiles) {
  // 1025 rows cost as 1152 (9 tiles of 128): 9/8 of 1024 rows at the same N and K (both
  // compute-bound: 1024 x 8192 x 8192 does about 800 FLOPs a byte, the ridge is 166).
  const ComputeModel c = a100();
  EXPECT_NEAR(gemm_seconds(c, 1025, 8192, 8192) / gemm_seconds(c, 1024, 8192, 8192), 9.0 / 8, 1e-12);
  // Without tiles (gemm_tile 0) 1025 rows cost 1025/1024 of 1024.
  ComputeModel flat = c;
  flat.gemm_tile = 0;
  EXPECT_NEAR(gemm_seconds(flat, 1025, 8192, 8192) / gemm_seconds(flat, 1024, 8192, 8192),
              1025.0 / 1024, 1e-12);
  // 128 rows of the same weight are memory-bound: the weight's 134 MB dominate.
  EXPECT_NEAR(gemm_seconds(c, 128, 8192, 8192),
              2.0 * (128.0 * 8192 * 2 + 8192.0 * 8192) / (2039e9 * 0.7), 1e-12);
}

TEST(Compute, ThinGemmIsMemoryBound) {
  // 8192 x 8192 x 16: 2 * 8192^2 * 16 FLOPs take 9.0 us at 0.76 of peak; its operands, 2 bytes
  // each of 8192 * 16 * 2 + 8192^2, take 134.2 MB / 1427.3 GB/s = 94.3 us: the roofline's
  // memory side.
  const double t = gemm_seconds(a100(), 8192, 8192, 16);
  EXPECT_NEAR(t, 2.0 * (8192.0 * 16 * 2 + 8192.0 * 8192) / (2039e9 * 0.7), 1e-12);
  EXPECT_GT(t, 10 * 2 * 8192.0 * 8192 * 16 / (0.76 * 312e12));
}

TEST(Compute, StreamsAtTheirFraction) {
  EXPECT_NEAR(stream_seconds(a100(), 1e9), 1e9 / (0.7 * 2039e9), 1e-15);
  EXPECT_EQ(gemm_seconds(a100(), 0, 10, 10), 0);
}

TEST(Compute, ShortSmallestDimensionRunsSlower) {
  // gemm_half 256: 8192 x 8192 x 128 (attention's head size as K) runs at 128 / (128 + 256) of
  // the efficiency, 8192^3 at 8192 / 8448 of it; without gemm_half both at 0.76.
  ComputeModel c = a100();
  c.gemm_half = 256;
  const double n = 8192;
  EXPECT_NEAR(gemm_seconds(c, n, n, 128), 2 * n * n * 128 / (0.76 * 128 / 384 * 312e12), 1e-12);
  EXPECT_NEAR(gemm_seconds(c, n, n, n), 2 * n * n * n / (0.76 * n / (n + 256) * 312e12), 1e-12);
  // The smallest dimension, whichever it is.
  EXPECT_NEAR(gemm_seconds(c, 128, n, n), gemm_seconds(c, n, 128, n), 1e-15);
  EXPECT_NEAR(gemm_seconds(c, 128, n, n), gemm_seconds(c, n, n, 128), 1e-15);
}
