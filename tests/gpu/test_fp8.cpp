// The CUDA FP8 ops against tessera's own codec (common/fp8_format.hpp) and the CPU ops: the device rounds
// with CUDA's conversions (cuda_fp8.h), the CPU with an implementation written independently, and
// the two must agree to the bit on every code of both formats, on the midpoints between
// neighbouring codes (ties to even), past the largest finite value (saturation), in the
// subnormal range, and on random values at a scale, in both layouts. The GEMM (cuBLASLt's where
// it takes the shape, emulated with its own decoding; tessera's kernel elsewhere) against sums in
// double of the codes' values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "common/fp8_format.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

namespace gpu = tessera::cuda;

template <typename F>
class CudaFp8 : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
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

void expect_codes(const std::vector<double>& got, const std::vector<uint8_t>& want,
                  const std::vector<double>& in, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int shown = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != double(want[i]) && shown++ < 5)
      ADD_FAILURE() << what << ": input " << in[i] << " -> code " << got[i] << " on the device, "
                    << int(want[i]) << " on the CPU";
}

// x (rows, cols) cast at `scale` on the device into both layouts: every code as the CPU's
// fp8_encode gives it; the amax slot folds max |x| into what it held, the scale slot holds 1/scale.
template <typename F>
void check_cast(std::vector<double> x, int cols, float scale, Fp8Format f, const std::string& what) {
  const int rows = int((x.size() + size_t(cols) - 1) / size_t(cols));
  x.resize(size_t(rows) * size_t(cols), 0.0);
  Dev<F> d_x(x);
  Dev<uint8_t> d_out(x.size()), d_t(x.size());
  Dev<float> d_amax(std::vector<double>{0.125}), d_inv(1);
  gpu::fp8_cast<F>(d_out, d_t, d_x, rows, cols, scale, f, d_amax, d_inv);
  std::vector<uint8_t> want(x.size()), want_t(x.size());
  std::vector<double> in_t(x.size());
  double amax = 0.125;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t at = size_t(r) * cols + c, at_t = size_t(c) * rows + r;
      want[at] = want_t[at_t] = fp8_encode(float(x[at]) * scale, f);
      in_t[at_t] = x[at];
      amax = std::max(amax, std::fabs(x[at]));
    }
  expect_codes(d_out.fetch(), want, x, what);
  expect_codes(d_t.fetch(), want_t, in_t, what + ", transposed");
  EXPECT_EQ(d_amax.fetch()[0], double(float(amax))) << what;
  EXPECT_EQ(d_inv.fetch()[0], double(1.0f / scale)) << what;
}

TYPED_TEST(CudaFp8, CastEveryCodeTieAndEdgeInBothLayouts) {
  using F = TypeParam;
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const std::string name = f == Fp8Format::E4M3 ? "E4M3" : "E5M2";
    std::vector<double> x = probes(f);
    for (double& v : x) v = round_to<F>(v);  // what the device holds (bf16 keeps these exactly)
    check_cast<F>(x, 37, 1.0f, f, name + " at scale 1");  // 37: tiles cut at both edges
    // More tiles than blocks (the kernel's grid-stride loop), at a scale not a power of two.
    check_cast<F>(random_of<F>(size_t(2000) * 300, -300.0, 300.0), 300, 0.37f, f,
                  name + " at scale 0.37");
  }
}

TYPED_TEST(CudaFp8, CastFoldsTheAmaxAndNaNSticks) {
  using F = TypeParam;
  auto x = random_of<F>(size_t(70) * 33, -3.0, 3.0);
  x[1000] = round_to<F>(-7.25);
  Dev<F> d_x(x);
  Dev<uint8_t> d_out(x.size());
  Dev<float> d_amax(std::vector<double>{0.0}), d_inv(1);
  gpu::fp8_cast<F>(d_out, nullptr, d_x, 70, 33, 2.0f, Fp8Format::E4M3, d_amax, d_inv);
  EXPECT_EQ(d_amax.fetch()[0], 7.25);
  // A smaller tensor leaves the larger amax; an empty one only writes the scale.
  gpu::fp8_cast<F>(nullptr, d_out, d_x, 10, 33, 4.0f, Fp8Format::E5M2, d_amax, d_inv);
  EXPECT_EQ(d_amax.fetch()[0], 7.25);
  gpu::fp8_cast<F>(d_out, nullptr, d_x, 0, 33, 8.0f, Fp8Format::E4M3, d_amax, d_inv);
  EXPECT_EQ(d_amax.fetch()[0], 7.25);
  EXPECT_EQ(d_inv.fetch()[0], 0.125);
  x[5] = std::numeric_limits<double>::quiet_NaN();
  Dev<F> d_nan(x);
  gpu::fp8_cast<F>(d_out, nullptr, d_nan, 70, 33, 1.0f, Fp8Format::E4M3, d_amax, d_inv);
  EXPECT_TRUE(std::isnan(d_amax.fetch()[0]));
  gpu::fp8_cast<F>(d_out, nullptr, d_x, 70, 33, 1.0f, Fp8Format::E4M3, d_amax, d_inv);
  EXPECT_TRUE(std::isnan(d_amax.fetch()[0]));
}

// Random finite codes of a format for n elements (values of both signs over most of the range).
std::vector<double> random_codes(size_t n, Fp8Format f) {
  std::vector<double> codes(n);
  const auto v = random_of<float>(n, -1.0, 1.0);
  for (size_t i = 0; i < n; i++) {
    const double magnitude = std::ldexp(1.0, int(std::fabs(v[i]) * 12) - 6);
    codes[i] = fp8_encode(float(v[i] * magnitude * (f == Fp8Format::E4M3 ? 20 : 2000)), f);
  }
  return codes;
}

// d (M,N) = 0.5 · 3 · X (M,K) · Y (N,K)ᵀ [+ d] [+ bias] on the device, against the same sum in
// double of the codes' values: within fp32's rounding of the sum (K terms) and D's of the result.
// `lt`: cuBLASLt takes the shape (counted by fp8_lt_gemms), else tessera's kernel runs it.
template <typename D, typename F>
void check_gemm(int M, int N, int K, Fp8Format fx, Fp8Format fy, bool bias, bool accumulate,
                bool lt) {
  const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + (bias ? " bias" : "") +
                           (accumulate ? " accumulate" : "");
  const auto x = random_codes(size_t(M) * K, fx), y = random_codes(size_t(N) * K, fy);
  const auto b = random_of<F>(size_t(N), -2.0, 2.0), d0 = random_of<D>(size_t(M) * N, -50.0, 50.0);
  Dev<uint8_t> d_x(x), d_y(y);
  Dev<float> d_x_inv(std::vector<double>{0.5}), d_y_inv(std::vector<double>{3.0});
  Dev<F> d_bias(b);
  Dev<D> d(d0);
  const long before = gpu::fp8_lt_gemms();
  gpu::fp8_gemm<D, F>(d, {d_x.get(), fx, d_x_inv.get()}, {d_y.get(), fy, d_y_inv.get()}, M, N, K,
                      bias ? d_bias.get() : nullptr, accumulate);
  const std::vector<double> got = d.fetch();
  EXPECT_EQ(gpu::fp8_lt_gemms() - before, lt ? 1 : 0) << what;
  const double out_ulp = std::is_same_v<D, float> ? std::ldexp(1.0, -23) : std::ldexp(1.0, -8);
  int shown = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double sum = 0, terms = 0;
      for (int k = 0; k < K; k++) {
        const double p = double(fp8_decode(uint8_t(x[size_t(m) * K + k]), fx)) *
                         double(fp8_decode(uint8_t(y[size_t(n) * K + k]), fy));
        sum += p;
        terms += std::fabs(p);
      }
      double want = 1.5 * sum;
      const size_t at = size_t(m) * N + n;
      if (accumulate) want += d0[at];
      if (bias) want += b[size_t(n)];
      const double bound = 1.5 * terms * (K + 2) * std::ldexp(1.0, -24) +
                           (std::fabs(want) + 1e-30) * out_ulp + (accumulate ? 1e-4 : 0.0);
      if (!(std::fabs(got[at] - want) <= bound) && shown++ < 5)
        ADD_FAILURE() << what << ": d[" << m << "][" << n << "] = " << got[at] << ", want " << want
                      << " (bound " << bound << ")";
    }
}

TEST(CudaFp8Gemm, CublasLtWhereTheShapeAllowsTheKernelElsewhere) {
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  // The forward: bf16 out with the bias, overwritten.
  check_gemm<bf16, bf16>(32, 48, 64, e4, e4, true, false, true);
  // dinp: the output gradient in E5M2, accumulated into bf16.
  check_gemm<bf16, bf16>(48, 32, 80, e5, e4, false, true, true);
  // dweight: accumulated into fp32.
  check_gemm<float, bf16>(64, 16, 96, e5, e4, false, true, true);
  // Shapes cuBLASLt's FP8 kernels refuse: not multiples of 16; both operands E5M2.
  check_gemm<bf16, bf16>(37, 21, 29, e4, e4, true, false, false);
  check_gemm<float, bf16>(20, 33, 17, e5, e4, false, true, false);
  check_gemm<bf16, bf16>(32, 32, 32, e5, e5, false, false, false);
  // fp32 activations (no cuBLASLt FP8 kernel has an fp32 bias): the kernel, aligned or not.
  check_gemm<float, float>(32, 48, 64, e4, e4, true, false, false);
  check_gemm<float, float>(5, 7, 3, e4, e5, true, true, false);
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
