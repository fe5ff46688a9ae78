// The CUDA FP8 ops against tessera's own codec (common/fp8_format.hpp) and the CPU ops: the device rounds
// with CUDA's conversions (cuda_fp8.h), the CPU with an implementation written independently, and
// the two must agree to the bit on every code of both formats, on the midpoints between
// neighbouring codes (ties to even), past the largest finite value (saturation), in the
// subnormal range, and on random values at a scale, in both layouts. The GEMM (cuBLASLt's where
// it takes the shape, emulated with its own decoding; tessera's kernel elsewhere) against sums in
// double of the codes' values.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
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

// ZeRO-3's gathered codes placed (fp8_place): on the device the cast's own two layouts and its
// scale slot, and the CPU's place to the byte, for tiles cut at both edges and for more tiles
// than the grid (a grid-stride loop).
TEST(CudaFp8Place, GivesTheCastsTwoLayoutsAndTheCpusBytes) {
  for (const auto& [rows, cols] : {std::pair{70, 37}, std::pair{1, 1000}, std::pair{2100, 1030}}) {
    const size_t n = size_t(rows) * size_t(cols);
    const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
    Dev<float> d_x(random_of<float>(n, -300.0, 300.0));
    Dev<uint8_t> d_codes(n), d_codes_t(n), d_out(n), d_out_t(n);
    Dev<float> d_amax(std::vector<double>{0.0}), d_inv(1), d_place_inv(1);
    gpu::fp8_cast<float>(d_codes, d_codes_t, d_x, rows, cols, 0.37f, Fp8Format::E4M3, d_amax, d_inv);
    gpu::fp8_place(d_out, d_out_t, d_codes, rows, cols, 1.0f / 0.37f, d_place_inv);
    const std::vector<double> codes = d_codes.fetch(), codes_t = d_codes_t.fetch();
    EXPECT_EQ(d_out.fetch(), codes) << what;
    EXPECT_EQ(d_out_t.fetch(), codes_t) << what << ", transposed";
    EXPECT_EQ(d_place_inv.fetch()[0], d_inv.fetch()[0]) << what;
    std::vector<uint8_t> host(n), cpu_out(n), cpu_t(n);
    for (size_t i = 0; i < n; i++) host[i] = uint8_t(codes[i]);
    float cpu_inv = 0;
    cpu::fp8_place(cpu_out.data(), cpu_t.data(), host.data(), rows, cols, 1.0f / 0.37f, &cpu_inv);
    std::vector<double> cpu_t_values(cpu_t.begin(), cpu_t.end());
    EXPECT_EQ(cpu_t_values, codes_t) << what << ": the CPU's transpose";
    EXPECT_EQ(cpu_out, host) << what;
    EXPECT_EQ(double(cpu_inv), d_inv.fetch()[0]) << what;
  }
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

// How far a GEMM's result may lie from the exact one, from how its sum over K is accumulated.
//
// cuBLASLt on Hopper (and Ada) FP8 tensor cores, CUBLASLT_MATMUL_DESC_FAST_ACCUM off (fp8.cu's
// default): not fp32 throughout. DeepSeek-V3's report (arXiv 2412.19437, section 3.3.2,
// "Increasing Accumulation Precision"): "the accumulation precision of FP8 GEMM on NVIDIA H800
// GPUs is limited to retaining around 14 bits", with partial results promoted to fp32 registers
// every 128 elements (4 WGMMAs) in their kernels; cublasLt.h on FAST_ACCUM: with it on,
// "intermediate results will not periodically be promoted to a higher precision". So: K goes
// through MMAs of 32 consecutive k (wgmma's K for 8-bit inputs); MMA j adds its 32 exact products
// to the partial sum keeping about 14 significant bits. Taking 13, each of its 33 terms loses less
// than 2^-12 of the largest of them, M_j <= max(S_j, m_j): m_j the MMA's largest |product|, S_j
// the magnitudes of every product before it (the most the partial sum can hold, whatever
// cuBLASLt's promotion interval, which is not documented; never promoting, as fast accumulation
// does, included; x 1.001 for an accumulator that rounds rather than truncates). Under
// sum_j 33 * 2^-12 * M_j in all, plus at most one fp32 promotion per MMA, 2^-24 * P each (P =
// sum |x_k y_k|). The emulator's cuBLASLt models exactly this accumulation
// (src/device/emu/cublas_lt.cpp, TESSERA_EMU_FP8_ACCUM).
//
// tessera's kernel: fp32 in k order, (K - 1) * 2^-24 * P (Higham's gamma_(K-1)).
//
// Then the epilogue in fp32, scale * sum + C + bias: three roundings of 2^-24 of the magnitudes;
// and D's own rounding to nearest, 2^-24 (fp32) or 2^-8 (bf16) of the value rounded.
double hopper_accumulation(const std::vector<double>& products) {
  double before = 0, bound = 0;
  for (size_t k0 = 0; k0 < products.size(); k0 += 32) {
    double largest = 0, added = 0;
    for (size_t k = k0; k < std::min(products.size(), k0 + 32); k++) {
      largest = std::max(largest, std::fabs(products[k]));
      added += std::fabs(products[k]);
    }
    bound += 33.0 * std::ldexp(1.0, -12) * std::max(1.001 * before, largest) +
             std::ldexp(1.0, -24) * (before + added);
    before += added;
  }
  return bound;
}

struct Fp8Bound {
  double scale;    // the product of the two operands' 1/scale
  double out_ulp;  // D's unit round-off
  // want: the exact result; acc: the accumulation's bound, unscaled; P: sum |x_k y_k|; c, bias:
  // what the epilogue added.
  double operator()(double want, double acc, double P, double c, double bias) const {
    acc *= scale;
    const double epilogue =
        3.0 * std::ldexp(1.0, -24) * (scale * P + acc + std::fabs(c) + std::fabs(bias));
    return acc + epilogue + out_ulp * (std::fabs(want) + acc + epilogue) + 1e-30;
  }
};

// d (M,N) = 0.5 * 3 * X (M,K) * Y (N,K)^T [+ d] [+ bias] on the device, against the same sum in
// double of the codes' values, within Fp8Bound. `lt`: cuBLASLt takes the shape (counted by
// fp8_lt_gemms), else tessera's kernel runs it. The bias and d's prior values are of the size of
// the products' magnitudes, so that the bound's power shows: the results a wrong scale pointer
// (1/scale of X for both operands), a dropped bias or a dropped accumulation would give are
// computed here and must each lie at least 8 bounds away on some element.
// `offset`: the codes placed that many bytes past a 256-byte boundary; `scale_at`: the scales
// that many floats past one, off 16 bytes unless a multiple of 4: cublasLtMatmul turns those
// down, and fp8_gemm's kernel runs the call instead.
template <typename D, typename F>
void check_gemm(int M, int N, int K, Fp8Format fx, Fp8Format fy, bool bias, bool accumulate,
                bool lt, size_t offset = 0, size_t scale_at = 0) {
  const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + (bias ? " bias" : "") +
                           (accumulate ? " accumulate" : "") + (lt ? " (cuBLASLt)" : " (kernel)") +
                           (offset ? " codes at +" + std::to_string(offset) : "") +
                           (scale_at ? " scales at +" + std::to_string(4 * scale_at) : "");
  const auto x = random_codes(size_t(M) * K, fx), y = random_codes(size_t(N) * K, fy);
  const double x_inv = 0.5, y_inv = 3.0, scale = x_inv * y_inv;
  // Each output's exact sum, the magnitudes summed (P) and the accumulation's bound, cuBLASLt's
  // (Hopper's) and an fp32 sum's.
  std::vector<double> sum(size_t(M) * N), P(size_t(M) * N), column_P(static_cast<size_t>(N));
  std::vector<double> hopper(size_t(M) * N), products(static_cast<size_t>(K));
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0, t = 0;
      for (int k = 0; k < K; k++) {
        const double p = double(fp8_decode(uint8_t(x[size_t(m) * K + k]), fx)) *
                         double(fp8_decode(uint8_t(y[size_t(n) * K + k]), fy));
        s += p;
        t += std::fabs(p);
        products[size_t(k)] = p;
      }
      sum[size_t(m) * N + n] = s, P[size_t(m) * N + n] = t;
      hopper[size_t(m) * N + n] = hopper_accumulation(products);
      column_P[size_t(n)] = std::max(column_P[size_t(n)], t);
    }
  // Bias and prior d: 0.5 to 1 times the products' scaled magnitudes, either sign.
  const auto sign_and_size = random_of<double>(size_t(M) * N + size_t(N), -1.0, 1.0);
  auto sized = [&](size_t i, double magnitude) {
    const double r = sign_and_size[i];
    return (r < 0 ? -1.0 : 1.0) * (0.5 + 0.5 * std::fabs(r)) * scale * magnitude;
  };
  std::vector<double> b(static_cast<size_t>(N)), d0(size_t(M) * N);
  for (int n = 0; n < N; n++) b[size_t(n)] = round_to<F>(sized(size_t(M) * N + n, column_P[size_t(n)]));
  for (size_t i = 0; i < d0.size(); i++) d0[i] = round_to<D>(sized(i, P[i]));
  Dev<uint8_t> d_x(x, offset), d_y(y, offset);
  Dev<float> d_x_inv(std::vector<double>(1 + scale_at, x_inv)),
      d_y_inv(std::vector<double>(1 + scale_at, y_inv));
  Dev<F> d_bias(b);
  Dev<D> d(d0);
  const long before = gpu::fp8_lt_gemms();
  gpu::fp8_gemm<D, F>(d, {d_x.get(), fx, d_x_inv.get() + scale_at},
                      {d_y.get(), fy, d_y_inv.get() + scale_at}, M, N, K,
                      bias ? d_bias.get() : nullptr, accumulate);
  const std::vector<double> got = d.fetch();
  const bool ran_lt = gpu::fp8_lt_gemms() > before;
  EXPECT_EQ(ran_lt, lt && scale_at % 4 == 0) << what;
  const double out_ulp = std::is_same_v<D, float> ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  const Fp8Bound bound{scale, out_ulp};
  const double fp32_sum = double(K - 1) * std::ldexp(1.0, -24);  // x P
  double worst = 0, worst_fp32 = 0, wrong_scale = 0, no_bias = 0, no_accumulate = 0;
  int shown = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      const size_t at = size_t(m) * N + n;
      const double c = accumulate ? d0[at] : 0.0, bn = bias ? b[size_t(n)] : 0.0;
      const double want = scale * sum[at] + c + bn;
      const double acc = ran_lt ? hopper[at] : fp32_sum * P[at];
      const double tol = bound(want, acc, P[at], c, bn), err = std::fabs(got[at] - want);
      if (!(err <= tol) && shown++ < 5)
        ADD_FAILURE() << what << ": d[" << m << "][" << n << "] = " << got[at] << ", want " << want
                      << " (bound " << tol << ")";
      worst = std::max(worst, err / tol);
      worst_fp32 = std::max(worst_fp32, err / bound(want, fp32_sum * P[at], P[at], c, bn));
      wrong_scale = std::max(wrong_scale, std::fabs(scale - x_inv * x_inv) * std::fabs(sum[at]) / tol);
      no_bias = std::max(no_bias, std::fabs(bn) / tol);
      no_accumulate = std::max(no_accumulate, std::fabs(c) / tol);
    }
  std::printf("fp8 gemm %s: worst error %.3g of its bound (%.3g of an fp32 sum's); a wrong scale "
              "pointer would be %.3g bounds off", what.c_str(), worst, worst_fp32, wrong_scale);
  if (bias) std::printf(", no bias %.3g", no_bias);
  if (accumulate) std::printf(", no accumulation %.3g", no_accumulate);
  std::printf("\n");
  EXPECT_GE(wrong_scale, 8.0) << what;
  if (bias) {
    EXPECT_GE(no_bias, 8.0) << what;
  }
  if (accumulate) {
    EXPECT_GE(no_accumulate, 8.0) << what;
  }
#ifdef TESSERA_CUDA_EMU
  // The emulator's cuBLASLt accumulates as Hopper does (unless told fp32): with an fp32 D some
  // element lies beyond what fp32 sums would allow, the error the bound above was derived for (a
  // bf16 D's own rounding hides it).
  const char* mode = std::getenv("TESSERA_EMU_FP8_ACCUM");
  if (ran_lt && std::is_same_v<D, float> && (!mode || std::string(mode) != "fp32")) {
    EXPECT_GT(worst_fp32, 1.0) << what << ": the emulator's Hopper accumulation left no trace";
  }
#endif
}

TEST(CudaFp8Gemm, CublasLtWhereTheShapeAllowsTheKernelElsewhere) {
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  // The forward: bf16 out with the bias, overwritten.
  check_gemm<bf16, bf16>(32, 48, 64, e4, e4, true, false, true);
  // dinp: the output gradient in E5M2, accumulated into bf16.
  check_gemm<bf16, bf16>(48, 32, 80, e5, e4, false, true, true);
  // dweight: accumulated into fp32; K = 288 spans three of the 128-k promotion blocks.
  check_gemm<float, bf16>(64, 16, 96, e5, e4, false, true, true);
  check_gemm<float, bf16>(16, 32, 288, e5, e4, false, true, true);
  // Shapes cuBLASLt's FP8 kernels refuse: not multiples of 16; both operands E5M2.
  check_gemm<bf16, bf16>(37, 21, 29, e4, e4, true, false, false);
  check_gemm<float, bf16>(20, 33, 17, e5, e4, false, true, false);
  check_gemm<bf16, bf16>(32, 32, 32, e5, e5, false, false, false);
  // fp32 activations (no cuBLASLt FP8 kernel has an fp32 bias): the kernel, aligned or not.
  check_gemm<float, float>(32, 48, 64, e4, e4, true, false, false);
  check_gemm<float, float>(5, 7, 3, e4, e5, true, true, false);
}

// cuBLASLt's heuristic assumes 256-byte aligned operands unless told, and tessera's FP8 codes sit at
// 16-byte offsets of the arena: fp8.cu tells it the alignment each call has and keeps a plan per
// alignment. One shape whose leading dimensions allow 256 bytes (K = 256 codes, N = 128 bf16):
// first with aligned codes, then with codes 16 bytes off (the plan of the first must not be
// reused: the emulator's cuBLASLt, as a GPU may, refuses operands below the alignment the
// algorithm was chosen for), then aligned again.
TEST(CudaFp8Gemm, EachAlignmentGetsAnAlgorithmChosenForIt) {
  const Fp8Format e4 = Fp8Format::E4M3;
  check_gemm<bf16, bf16>(32, 128, 256, e4, e4, true, false, true);
  check_gemm<bf16, bf16>(32, 128, 256, e4, e4, true, false, true, 16);
  check_gemm<bf16, bf16>(32, 128, 256, e4, e4, true, false, true, 48);
  check_gemm<bf16, bf16>(32, 128, 256, e4, e4, true, false, true);
}

// The training's GEMMs as Fp8Linear makes them: LLaMA's forward without a bias; then each with
// its scales 4 bytes past a 16-byte boundary, as Fp8Linear once packed them: an H200's
// cublasLtMatmul (cuBLAS 13.1) refused those calls with CUBLAS_STATUS_NOT_SUPPORTED after its
// heuristic had chosen an algorithm, which ended the run. fp8_gemm now hands such a call to its
// kernel (right all the same) and fp8_report names it; Fp8Linear keeps each scale in a 16-byte
// slot (test_trainer.sh's cuda_fp8: every training GEMM on cuBLASLt, the emulator's included).
TEST(CudaFp8Gemm, ScalesOffSixteenBytesGoToTheKernelAndAreNamed) {
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  check_gemm<bf16, bf16>(64, 96, 32, e4, e4, false, false, true);
  check_gemm<bf16, bf16>(64, 96, 32, e4, e4, true, false, true, 0, 1);
  check_gemm<bf16, bf16>(64, 32, 96, e5, e4, false, true, true, 0, 1);
  check_gemm<float, bf16>(96, 32, 64, e5, e4, false, true, true, 0, 1);
  const std::string report = gpu::fp8_report();
  EXPECT_NE(report.find("cublasLtMatmul refused 64x32x96 beta=1 scales at 4,4 mod 16"),
            std::string::npos) << report;
  // The plan is dropped: the same key goes to the kernel without asking cuBLASLt again.
  check_gemm<bf16, bf16>(64, 96, 32, e4, e4, true, false, false);
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
