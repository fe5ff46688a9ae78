// The CUDA FP8 ops against tessera's own codec (common/fp8.hpp) and the CPU ops: the device rounds
// with CUDA's conversions (cuda_fp8.h), the CPU with an implementation written independently, and
// the two must agree to the bit on every code of both formats, on the midpoints between
// neighbouring codes (ties to even), past the largest finite value (saturation), in the
// subnormal range, and on random values at a scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "common/fp8.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

namespace gpu = tessera::cuda;

template <typename F>
class CudaFp8 : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};
TYPED_TEST_SUITE(CudaFp8, Types, TypeNames);

// Every finite value of the format, the midpoint between each pair of neighbours (a tie), values
// just inside and past the largest, a quarter and a half of the smallest subnormal, all signed.
std::vector<double> probes(Fp8Format f) {
  std::vector<double> codes;
  for (int c = 0; c < 128; c++) {
    const float v = fp8_decode(uint8_t(c), f);
    if (std::isfinite(v)) codes.push_back(v);
  }
  std::vector<double> out = codes;
  for (size_t i = 0; i + 1 < codes.size(); i++) out.push_back(0.5 * (codes[i] + codes[i + 1]));
  const double max = fp8_max(f), tiny = codes[1];
  for (double x : {max * 1.01, max * 1.2, max * 4.0, 1e30, tiny * 0.25, tiny * 0.5, tiny * 0.75})
    out.push_back(x);
  const size_t n = out.size();
  for (size_t i = 0; i < n; i++) out.push_back(-out[i]);
  return out;
}

// The CPU's definition, element by element: fp8_round(x * scale) / scale, then to F.
template <typename F>
std::vector<double> expected(const std::vector<double>& x, float scale, Fp8Format f) {
  const float inv = 1.0f / scale;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); i++)
    out[i] = round_to<F>(double(fp8_round(float(x[i]) * scale, f) * inv));
  return out;
}

template <typename F>
void expect_bitwise(const std::vector<double>& got, const std::vector<double>& want,
                    const std::vector<double>& in, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int shown = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const bool same = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
    if (!same && shown++ < 5)
      ADD_FAILURE() << what << ": input " << in[i] << " -> " << got[i] << " on the device, "
                    << want[i] << " on the CPU";
  }
}

TYPED_TEST(CudaFp8, QuantizeEveryCodeTieAndEdge) {
  using F = TypeParam;
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const std::string name = f == Fp8Format::E4M3 ? "E4M3" : "E5M2";
    std::vector<double> x = probes(f);
    for (double& v : x) v = round_to<F>(v);  // what the device holds (bf16 keeps these exactly)
    Dev<F> d_x(x), d_out(x.size());
    gpu::fp8_quantize<F>(d_out, d_x, x.size(), 1.0f, f);
    expect_bitwise<F>(d_out.fetch(), expected<F>(x, 1.0f, f), x, name + " at scale 1");
    // In place, at a scale that is not a power of two.
    const auto y = random_of<F>(4099, -300.0, 300.0);
    Dev<F> d_y(y);
    gpu::fp8_quantize<F>(d_y, d_y, y.size(), 0.37f, f);
    expect_bitwise<F>(d_y.fetch(), expected<F>(y, 0.37f, f), y, name + " at scale 0.37, in place");
  }
}

TYPED_TEST(CudaFp8, AmaxIsTheLargestMagnitudeOrNaN) {
  using F = TypeParam;
  auto x = random_of<F>(100003, -3.0, 3.0);  // many blocks, and a tail
  x[77777] = round_to<F>(-7.25);
  Dev<F> d_x(x);
  EXPECT_EQ(gpu::fp8_amax<F>(d_x, x.size()), 7.25f);
  EXPECT_EQ(gpu::fp8_amax<F>(d_x, 77777), [&] {
    double m = 0;
    for (size_t i = 0; i < 77777; i++) m = std::max(m, std::fabs(x[i]));
    return float(m);
  }());
  x[5] = std::numeric_limits<double>::quiet_NaN();
  Dev<F> d_nan(x);
  EXPECT_TRUE(std::isnan(gpu::fp8_amax<F>(d_nan, x.size())));
  EXPECT_EQ(gpu::fp8_amax<F>(d_nan, 0), 0.0f);
}

TYPED_TEST(CudaFp8, BiasBackwardIsTheColumnSum) {
  using F = TypeParam;
  const int N = 67, OC = 45;
  const auto dout = random_of<F>(size_t(N) * OC);
  const auto dbias = random_of<float>(OC);
  Dev<F> d_dout(dout);
  Dev<float> d_dbias(dbias);
  gpu::bias_backward<F>(d_dbias, d_dout, N, OC);
  const std::vector<double> got = d_dbias.fetch();
  for (int o = 0; o < OC; o++) {
    double want = dbias[size_t(o)];
    for (int r = 0; r < N; r++) want += dout[size_t(r) * OC + o];
    EXPECT_NEAR(got[size_t(o)], want, 1e-5 * (1.0 + std::fabs(want))) << "column " << o;
  }
}

}  // namespace
}  // namespace tessera::gpu_test
