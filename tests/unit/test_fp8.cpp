// The FP8 codecs (common/fp8_format.hpp) against a reference written differently: each code's value
// from its sign, exponent and mantissa fields by the textbook formula in double, and rounding as
// an exhaustive search for the nearest finite code, a tie going to the code whose last bit is 0,
// anything beyond the largest finite value saturating to it. Every one of the 256 codes of each
// format, the midpoints between neighbours (and a hair either side), values past the largest,
// the subnormals and the values below half the smallest, and random values over the whole range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/fp8_format.hpp"
#include "backend/cpu/backend.hpp"
#include "model/fp8.hpp"

using namespace tessera;

namespace {

struct Reference {
  int E, M, bias;
  bool ieee;  // E5M2: the all-ones exponent is infinity and NaN; E4M3: only S.1111.111 is NaN

  bool is_nan(int code) const {
    const int e = (code >> M) & ((1 << E) - 1), m = code & ((1 << M) - 1);
    if (ieee) return e == (1 << E) - 1 && m != 0;
    return e == (1 << E) - 1 && m == (1 << M) - 1;
  }
  bool is_inf(int code) const {
    const int e = (code >> M) & ((1 << E) - 1), m = code & ((1 << M) - 1);
    return ieee && e == (1 << E) - 1 && m == 0;
  }
  double value(int code) const {
    const int s = code >> 7, e = (code >> M) & ((1 << E) - 1), m = code & ((1 << M) - 1);
    const double frac = double(m) / double(1 << M);
    const double mag = e == 0 ? std::pow(2.0, 1 - bias) * frac : std::pow(2.0, e - bias) * (1 + frac);
    return s ? -mag : mag;
  }
  // The finite non-negative codes, ascending.
  std::vector<int> positive() const {
    std::vector<int> out;
    for (int c = 0; c < 128; ++c)
      if (!is_nan(c) && !is_inf(c)) out.push_back(c);
    return out;
  }
  double max() const { return value(positive().back()); }
  // The code x rounds to (x finite).
  int round(double x) const {
    const double a = std::fabs(x);
    const int sign = std::signbit(x) ? 0x80 : 0;
    const std::vector<int> codes = positive();
    if (a >= max()) return sign | codes.back();
    int best = codes[0];
    for (int c : codes) {
      const double d = std::fabs(a - value(c)), db = std::fabs(a - value(best));
      if (d < db || (d == db && (c & 1) == 0 && (best & 1) == 1)) best = c;
    }
    return sign | best;
  }
};

const Reference kE4M3{4, 3, 7, false};
const Reference kE5M2{5, 2, 15, true};

struct Case {
  Fp8Format format;
  const Reference& ref;
  const char* name;
};
const Case kCases[] = {{Fp8Format::E4M3, kE4M3, "e4m3"}, {Fp8Format::E5M2, kE5M2, "e5m2"}};

// x rounded by the codec equals the reference's nearest code, as a code and as a value.
void expect_rounds(const Case& c, float x) {
  const int want = c.ref.round(double(x));
  EXPECT_EQ(int(fp8_encode(x, c.format)), want) << c.name << " x = " << x;
  EXPECT_EQ(double(fp8_round(x, c.format)), c.ref.value(want)) << c.name << " x = " << x;
}

}  // namespace

TEST(Fp8, LimitsMatchThePaper) {
  EXPECT_EQ(kE4M3.max(), 448.0);
  EXPECT_EQ(kE5M2.max(), 57344.0);
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(kE4M3.value(1), std::ldexp(1.0, -9));   // smallest subnormal
  EXPECT_EQ(kE5M2.value(1), std::ldexp(1.0, -16));
  EXPECT_EQ(kE4M3.positive().size(), 127u);  // 0x00..0x7E
  EXPECT_EQ(kE5M2.positive().size(), 124u);  // 0x00..0x7B
}

TEST(Fp8, EveryCodeDecodesAndRoundTrips) {
  for (const Case& c : kCases) {
    for (int code = 0; code < 256; ++code) {
      const float v = fp8_decode(uint8_t(code), c.format);
      if (c.ref.is_nan(code)) {
        EXPECT_TRUE(std::isnan(v)) << c.name << " code " << code;
        EXPECT_TRUE(std::isnan(fp8_round(v, c.format)));
        continue;
      }
      if (c.ref.is_inf(code)) {
        EXPECT_EQ(v, code & 0x80 ? -INFINITY : INFINITY) << c.name << " code " << code;
        // Saturating: an infinity encodes as the largest finite value of its sign.
        EXPECT_EQ(double(fp8_round(v, c.format)), code & 0x80 ? -c.ref.max() : c.ref.max());
        continue;
      }
      EXPECT_EQ(double(v), c.ref.value(code)) << c.name << " code " << code;
      EXPECT_EQ(fp8_decode(fp8_encode(v, c.format), c.format), v) << c.name << " code " << code;
      EXPECT_EQ(fp8_round(v, c.format), v);
      // Codes encode to themselves (the two zeros included).
      EXPECT_EQ(int(fp8_encode(v, c.format)), code) << c.name << " code " << code;
    }
    EXPECT_EQ(int(fp8_encode(NAN, c.format)), 0x7F);
    EXPECT_TRUE(std::isnan(fp8_decode(0x7F, c.format)));
  }
}

TEST(Fp8, MidpointsTieToEven) {
  for (const Case& c : kCases) {
    const std::vector<int> codes = c.ref.positive();
    int ties = 0;
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const double lo = c.ref.value(codes[i]), hi = c.ref.value(codes[i + 1]);
      const float mid = float((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2);  // exact in float
      for (float x : {mid, -mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f),
                      -std::nextafter(mid, 1e9f)})
        expect_rounds(c, x);
      // The tie itself goes to the even neighbour.
      const int even = (codes[i] & 1) == 0 ? codes[i] : codes[i + 1];
      EXPECT_EQ(int(fp8_encode(mid, c.format)), even) << c.name << " mid " << mid;
      ++ties;
    }
    EXPECT_GT(ties, 100);
  }
}

TEST(Fp8, SaturatesBeyondTheLargest) {
  for (const Case& c : kCases) {
    const float max = float(c.ref.max());
    const float ulp = float(max - c.ref.value(c.ref.positive().end()[-2]));
    for (float x : {max, std::nextafter(max, 1e30f), max + ulp / 2, max + ulp, 2 * max, 1e30f,
                    INFINITY}) {
      EXPECT_EQ(fp8_round(x, c.format), max) << c.name << " x = " << x;
      EXPECT_EQ(fp8_round(-x, c.format), -max) << c.name << " x = " << -x;
      EXPECT_EQ(fp8_decode(fp8_encode(x, c.format), c.format), max);
    }
  }
}

TEST(Fp8, SubnormalsAndTheSmallest) {
  for (const Case& c : kCases) {
    const float tiny = float(c.ref.value(1));  // smallest subnormal
    EXPECT_EQ(fp8_round(tiny / 2, c.format), 0.0f);            // tie to 0 (even)
    EXPECT_EQ(fp8_round(std::nextafter(tiny / 2, 1.0f), c.format), tiny);
    EXPECT_EQ(fp8_round(tiny / 3, c.format), 0.0f);
    EXPECT_EQ(fp8_round(1e-30f, c.format), 0.0f);
    EXPECT_TRUE(std::signbit(fp8_round(-1e-30f, c.format)));   // -0 keeps its sign
    EXPECT_EQ(int(fp8_encode(-1e-30f, c.format)), 0x80);
    EXPECT_EQ(fp8_round(1.5f * tiny, c.format), 2 * tiny);     // tie 1 | 2: to 2 (even)
    EXPECT_EQ(fp8_round(2.5f * tiny, c.format), 2 * tiny);     // tie 2 | 3: to 2
    for (int k = 0; k < 4000; ++k) expect_rounds(c, tiny * float(k) / 37.0f);
  }
}

// device.fp8_margin's bound (fp8_max_margin): at it a tensor's amax, scaled to max / 2^margin,
// is still a normal number of the format (a code with an exponent); one more and it is below the
// smallest normal. E4M3 from 19 on: zero.
TEST(Fp8, MarginBoundKeepsTheAmaxNormal) {
  for (const Case& c : kCases) {
    const Fp8Traits t = fp8_traits(c.format);
    const int bound = fp8_max_margin(c.format);
    const uint8_t code = fp8_encode(std::ldexp(t.max, -bound), c.format);
    EXPECT_GT((code & 0x7f) >> t.mantissa_bits, 0) << c.name;
    EXPECT_LT(std::ldexp(t.max, -(bound + 1)), std::ldexp(1.0f, t.min_exp)) << c.name;
  }
  EXPECT_EQ(fp8_max_margin(Fp8Format::E4M3), 14);
  EXPECT_NE(fp8_round(std::ldexp(448.0f, -18), Fp8Format::E4M3), 0.0f);
  EXPECT_EQ(fp8_round(std::ldexp(448.0f, -19), Fp8Format::E4M3), 0.0f);
}

TEST(Fp8, RandomValuesOverTheWholeRange) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> exponent(-20.0f, 18.0f), sign(-1.0f, 1.0f);
  for (const Case& c : kCases)
    for (int i = 0; i < 20000; ++i)
      expect_rounds(c, std::copysign(std::exp2(exponent(rng)), sign(rng)));
}

// Delayed scaling (model/fp8.hpp): a scale from the history of the steps before (max or most
// recent), the current amax only while there is none, the margin, the step's amaxes committed at
// its end or dropped, the histories as a checkpoint holds them.
TEST(Fp8Scaling, DelayedFromTheHistory) {
  Fp8Options o;
  o.on = true;
  o.history = 3;
  Fp8State s(o, 2, 4, true);  // layers 2 and 3, and the head
  const int x = s.tensor(3, Fp8State::kFc1, Fp8State::kInput);
  const int g = s.tensor(2, Fp8State::kFc2, Fp8State::kGrad);
  const int h = s.tensor(Fp8State::kHead, 0, Fp8State::kWeight);
  EXPECT_EQ(h, 2 * Fp8State::kPerLayer + 1);
  EXPECT_EQ(s.format(Fp8State::kInput), Fp8Format::E4M3);
  EXPECT_EQ(s.format(Fp8State::kGrad), Fp8Format::E5M2);
  // The first step: no history, the current amax.
  EXPECT_FALSE(s.has_history(x));
  EXPECT_EQ(s.scale(x, 2.0f), 448.0f / 2.0f);
  EXPECT_EQ(s.scale(g, 4.0f), 57344.0f / 4.0f);
  EXPECT_EQ(s.scale(x, 0.0f), 1.0f);  // an all-zero tensor: any scale, 1
  // The step's largest amax is pending until the step ends; a skipped step drops it.
  s.observe(x, 2.0f);
  s.observe(x, 7.0f);
  s.observe(x, 3.0f);
  EXPECT_EQ(s.pending()[size_t(x)], 7.0f);
  s.discard();
  EXPECT_FALSE(s.has_history(x));
  EXPECT_EQ(s.pending()[size_t(x)], 0.0f);
  s.observe(x, 7.0f);
  s.commit();
  EXPECT_TRUE(s.has_history(x));
  EXPECT_EQ(s.scale(x, 1000.0f), 64.0f);  // 448 / 7: the history's, not the current
  for (float a : {1.0f, 0.5f}) {
    s.observe(x, a);
    s.commit();
  }
  EXPECT_EQ(s.scale(x, 1.0f), 64.0f);  // max of [0.5, 1, 7]
  s.observe(x, 0.25f);
  s.commit();  // the 7 falls out of a history of 3
  EXPECT_EQ(s.scale(x, 1.0f), 448.0f);
  const std::vector<float> layer3 = s.history(3);
  ASSERT_EQ(layer3.size(), size_t(Fp8State::kPerLayer) * 3);
  const size_t row = size_t(Fp8State::kFc1) * Fp8State::kRoles + Fp8State::kInput;
  EXPECT_EQ(std::vector<float>(layer3.begin() + long(row) * 3, layer3.begin() + long(row + 1) * 3),
            (std::vector<float>{0.25f, 0.5f, 1.0f}));  // newest first
  // A state no step has reached holds -1 everywhere; a checkpoint's rows restore it.
  Fp8State fresh(o, 2, 4, true);
  EXPECT_EQ(fresh.history(Fp8State::kHead), std::vector<float>(9, -1.0f));
  fresh.set_history(3, layer3);
  EXPECT_EQ(fresh.scale(x, 1.0f), 448.0f);
  EXPECT_THROW(fresh.set_history(2, {1.0f}), std::exception);

  // most_recent and the margin: (448 / 0.25) / 2^2.
  o.most_recent = true;
  o.margin = 2;
  Fp8State r(o, 0, 1, false);
  const int w = r.tensor(0, Fp8State::kQkv, Fp8State::kWeight);
  for (float a : {8.0f, 0.25f}) {
    r.observe(w, a);
    r.commit();
  }
  EXPECT_EQ(r.scale(w, 1.0f), 448.0f);
  // A non-finite amax never makes a scale that is not finite.
  r.observe(w, NAN);
  EXPECT_TRUE(std::isnan(r.pending()[size_t(w)]));
  r.observe(w, 1.0f);  // NaN sticks
  EXPECT_TRUE(std::isnan(r.pending()[size_t(w)]));
  r.commit();
  EXPECT_EQ(r.scale(w, 1.0f), 1.0f);
}

// The Fp8Linear tests' operands: n values of scale x N(0, 1), one seeded stream per test.
struct NormalValues {
  std::mt19937 rng;
  std::normal_distribution<float> normal{0.0f, 1.0f};
  std::vector<float> operator()(size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * normal(rng);
    return v;
  }
};

// The largest magnitude of n values; the values of their codes at `scale`, unscaled again (in
// double: the exact products' sums).
static float amax_of(const float* v, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}
static std::vector<double> coded_values(const float* v, size_t n, float scale, Fp8Format f) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = double(fp8_decode(fp8_encode(v[i] * scale, f), f)) * double(1.0f / scale);
  return out;
}

// The simulated FP8 GEMMs (Fp8Linear<CpuBackend>) against products worked out here in double
// from the codes of fp8_encode at the scales worked out by hand: the forward on E4M3 input and
// weight, the backward on the E5M2 output gradient, the bias gradient from the unrounded one; the
// amaxes collected for the step; the weight's codes reused until the step ends.
TEST(Fp8Linear, GemmsOnTheCodesOfEachOperand) {
  const int N = 6, IC = 5, OC = 4;
  NormalValues random{std::mt19937(3)};
  const std::vector<float> x = random(size_t(N) * IC, 3.0f), w = random(size_t(OC) * IC, 0.05f),
                           b = random(OC, 0.1f), g = random(size_t(N) * OC, 1e-4f);
  auto amax = [](const std::vector<float>& v) { return amax_of(v.data(), v.size()); };
  auto coded = [](const std::vector<float>& v, float scale, Fp8Format f) {
    return coded_values(v.data(), v.size(), scale, f);
  };
  const float sx = 448.0f / amax(x), sw = 448.0f / amax(w), sg = 57344.0f / amax(g);
  const std::vector<double> qx = coded(x, sx, Fp8Format::E4M3), qw = coded(w, sw, Fp8Format::E4M3),
                            qg = coded(g, sg, Fp8Format::E5M2);
  EXPECT_NE(qx[0], double(x[0]));  // the rounding is there to see
  auto expect_close = [](const std::vector<float>& got, const std::vector<double>& want,
                         const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-6 * (1.0 + std::fabs(want[i]))) << what << " " << i;
  };

  Fp8Options o;
  o.on = true;
  Comm tp(MPI_COMM_SELF);
  Arena arena(CpuBackend::memory());
  Fp8Sizes sizes;
  sizes.input = size_t(N) * IC;
  sizes.grad = size_t(N) * OC;
  sizes.weight[Fp8State::kFc1] = size_t(OC) * IC;
  Fp8Linear<CpuBackend> fp8(o, 0, 1, false, &tp, nullptr, sizes, arena);
  arena.allocate();
  fp8.bind();
  std::vector<float> out(size_t(N) * OC);
  std::vector<double> want(out.size());
  fp8.forward(0, Fp8State::kFc1, out.data(), x.data(), w.data(), b.data(), N, IC, OC);
  for (int n = 0; n < N; ++n)
    for (int oc = 0; oc < OC; ++oc) {
      double s = b[size_t(oc)];
      for (int i = 0; i < IC; ++i) s += qx[size_t(n) * IC + i] * qw[size_t(oc) * IC + i];
      want[size_t(n) * OC + oc] = s;
    }
  expect_close(out, want, "out");

  std::vector<float> dx(size_t(N) * IC, 0.5f), dw(size_t(OC) * IC, -0.25f), db(OC);
  std::vector<double> want_dx(dx.size(), 0.5), want_dw(dw.size(), -0.25);  // accumulated onto
  fp8.backward(0, Fp8State::kFc1, dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N,
               IC, OC);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i)
      for (int oc = 0; oc < OC; ++oc) {
        want_dx[size_t(n) * IC + i] += qg[size_t(n) * OC + oc] * qw[size_t(oc) * IC + i];
        want_dw[size_t(oc) * IC + i] += qg[size_t(n) * OC + oc] * qx[size_t(n) * IC + i];
      }
  expect_close(dx, want_dx, "dx");
  expect_close(dw, want_dw, "dw");
  std::vector<float> unrounded_db(OC), scratch_dx(dx.size()), scratch_dw(dw.size());
  cpu::matmul_backward(scratch_dx.data(), scratch_dw.data(), unrounded_db.data(), g.data(),
                       x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(db, unrounded_db);

  Fp8State& s = fp8.state();
  EXPECT_EQ(s.pending()[size_t(s.tensor(0, Fp8State::kFc1, Fp8State::kInput))], 0.0f);
  fp8.collect();
  EXPECT_EQ(s.pending()[size_t(s.tensor(0, Fp8State::kFc1, Fp8State::kInput))], amax(x));
  EXPECT_EQ(s.pending()[size_t(s.tensor(0, Fp8State::kFc1, Fp8State::kWeight))], amax(w));
  EXPECT_EQ(s.pending()[size_t(s.tensor(0, Fp8State::kFc1, Fp8State::kGrad))], amax(g));
  EXPECT_EQ(s.pending()[size_t(s.tensor(0, Fp8State::kQkv, Fp8State::kInput))], 0.0f);

  // Within the step the weight's codes stand: a changed weight is not read again. After the step
  // (commit), it is.
  std::vector<float> w2 = w, again(out.size());
  for (float& v : w2) v *= -1.0f;
  fp8.forward(0, Fp8State::kFc1, again.data(), x.data(), w2.data(), b.data(), N, IC, OC);
  EXPECT_EQ(again, out);
  s.commit();
  fp8.forward(0, Fp8State::kFc1, again.data(), x.data(), w2.data(), b.data(), N, IC, OC);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(again[i] - b[i % OC], -(out[i] - b[i % OC]), 1e-6) << i;
}

// What a run of the ZeRO-3 tests' GEMMs gives: each GEMM's outputs, a forward again at the end,
// the step's amaxes and the weights' codes' bytes; and the check that codes taking turns
// (`turns`) give what a place for every weight gives (`whole`), from half the bytes: `again` is
// that of whole.out[again_of], which differs from whole.out[other].
struct TurnsRun {
  std::vector<std::vector<float>> out, dx, dw;
  std::vector<float> again, amax;
  size_t bytes = 0;
};
void expect_turns_as_whole(const TurnsRun& whole, const TurnsRun& turns, size_t again_of,
                           size_t other) {
  EXPECT_EQ(turns.bytes * 2, whole.bytes);
  EXPECT_EQ(turns.out, whole.out);
  EXPECT_EQ(turns.dx, whole.dx);
  EXPECT_EQ(turns.dw, whole.dw);
  EXPECT_EQ(turns.again, whole.out[again_of]);
  EXPECT_EQ(turns.amax, whole.amax);
  EXPECT_NE(whole.out[again_of], whole.out[other]);  // another layer's codes would show
}

// Under ZeRO-3 (Fp8Options::layer_codes) four layers' weight codes take turns in two layers'
// places: forward 0..3, backward 3..0, then layer 0's forward again (its place held layer 2's
// codes since) give exactly what codes kept for every weight give, from half the bytes.
TEST(Fp8Linear, UnderZero3TwoLayersOfCodesTakeTurns) {
  const int N = 6, IC = 5, OC = 4, L = 4;
  NormalValues random{std::mt19937(5)};
  std::vector<std::vector<float>> w;
  for (int l = 0; l < L; ++l) w.push_back(random(size_t(OC) * IC, 0.05f * float(l + 1)));
  const std::vector<float> x = random(size_t(N) * IC, 3.0f), b = random(OC, 0.1f),
                           g = random(size_t(N) * OC, 1e-4f);
  Comm tp(MPI_COMM_SELF);
  Fp8Sizes sizes;
  sizes.input = size_t(N) * IC;
  sizes.grad = size_t(N) * OC;
  sizes.weight[Fp8State::kFc1] = size_t(OC) * IC;
  auto run = [&](bool layer_codes) {
    Fp8Options o;
    o.on = true;
    o.layer_codes = layer_codes;
    Arena arena(CpuBackend::memory());
    Fp8Linear<CpuBackend> fp8(o, 0, L, false, &tp, nullptr, sizes, arena);
    arena.allocate();
    fp8.bind();
    TurnsRun r;
    r.bytes = fp8.weight_bytes();
    for (int l = 0; l < L; ++l) {
      r.out.emplace_back(size_t(N) * OC);
      fp8.forward(l, Fp8State::kFc1, r.out.back().data(), x.data(), w[size_t(l)].data(), b.data(),
                  N, IC, OC);
    }
    for (int l = L - 1; l >= 0; --l) {
      r.dx.emplace_back(size_t(N) * IC, 0.0f);
      r.dw.emplace_back(size_t(OC) * IC, 0.0f);
      std::vector<float> db(OC);
      fp8.backward(l, Fp8State::kFc1, r.dx.back().data(), r.dw.back().data(), db.data(),
                   g.data(), x.data(), w[size_t(l)].data(), N, IC, OC);
    }
    r.again.resize(size_t(N) * OC);
    fp8.forward(0, Fp8State::kFc1, r.again.data(), x.data(), w[0].data(), b.data(), N, IC, OC);
    fp8.collect();
    r.amax = fp8.state().pending();
    return r;
  };
  expect_turns_as_whole(run(false), run(true), 0, 2);  // layer 0's, layer 2's place-mate's
}

// An MoE layer's routed experts (Fp8State::expert_tensor): per MoE layer, fc1's and fc2's
// dispatched rows' input and output gradient, then each expert's weight; after every layer's
// and the head's tensors, in the checkpoint's table too.
TEST(Fp8Scaling, ExpertTensorsAfterTheHead) {
  Fp8Options o;
  o.on = true;
  o.history = 2;
  Fp8State s(o, 2, 4, true, {3}, 4);  // layers 2 and 3 (3 an MoE layer of 4 experts), the head
  const int at = 2 * Fp8State::kPerLayer + Fp8State::kRoles;
  EXPECT_EQ(s.tensors(), at + 2 * (2 + 4));
  EXPECT_EQ(s.expert_tensor(3, Fp8State::kFc1, Fp8State::kInput, 0), at);
  EXPECT_EQ(s.expert_tensor(3, Fp8State::kFc1, Fp8State::kGrad, 0), at + 1);
  EXPECT_EQ(s.expert_tensor(3, Fp8State::kFc1, Fp8State::kWeight, 3), at + 5);
  EXPECT_EQ(s.expert_tensor(3, Fp8State::kFc2, Fp8State::kInput, 0), at + 6);
  EXPECT_EQ(s.expert_tensor(3, Fp8State::kFc2, Fp8State::kWeight, 0), at + 8);
  EXPECT_THROW(s.expert_tensor(2, Fp8State::kFc1, Fp8State::kInput, 0), std::logic_error);
  // Each row's format by its role: the output gradients' E5M2 (hybrid), the rest E4M3.
  EXPECT_EQ(s.scale(at + 1, 4.0f), 57344.0f / 4.0f);
  EXPECT_EQ(s.scale(at + 5, 4.0f), 448.0f / 4.0f);
  EXPECT_EQ(s.scale(at + 6, 4.0f), 448.0f / 4.0f);
  EXPECT_EQ(s.scale(at + 7, 4.0f), 57344.0f / 4.0f);
  // The experts' histories apart from the layer's (a checkpoint's rows after the head's).
  s.observe(at + 5, 3.0f);
  s.commit();
  const std::vector<float> h = s.history(3, true);
  ASSERT_EQ(h.size(), size_t(s.expert_rows()) * 2);
  EXPECT_EQ(h[5 * 2], 3.0f);
  EXPECT_EQ(h[5 * 2 + 1], -1.0f);
  EXPECT_EQ(s.history(3).size(), size_t(Fp8State::kPerLayer) * 2);
  EXPECT_EQ(Fp8State::table_rows(4, 2, 4), size_t(4 * 12 + 3 + 2 * 12));
}

// The experts' GEMMs (Fp8Linear::expert_forward, expert_backward) of an MoE layer on a rank
// holding experts 1 and 2 of 3, against products worked out here in double from fp8_encode's
// codes: a step without histories runs them in the compute type (the products of cpu::matmul,
// bit for bit) and records the amaxes of the rows (all of them, one per role) and of each
// expert's weight; the next step casts the rows of both experts at one scale, from their amax,
// and each expert's weight at its own. Scales shared between the experts' weights, or one per
// expert's rows, would give other products (checked here to differ).
TEST(Fp8Linear, ExpertsOnCodesWithAScaleEachAndOneForTheirRows) {
  const int IC = 5, OC = 4, n[2] = {3, 4}, N = n[0] + n[1];
  NormalValues random{std::mt19937(11)};
  const std::vector<float> x = random(size_t(N) * IC, 3.0f), b = random(OC, 0.1f);
  const std::vector<float> w[2] = {random(size_t(OC) * IC, 0.05f), random(size_t(OC) * IC, 2.0f)};
  std::vector<float> g = random(size_t(N) * OC, 1e-4f);
  for (size_t i = 0; i < size_t(n[0]) * OC; ++i) g[i] *= 100.0f;  // expert 0's rows the larger
  const auto amax = amax_of;
  const auto coded = coded_values;
  const size_t W = size_t(OC) * IC;
  Fp8Options o;
  o.on = true;
  Comm tp(MPI_COMM_SELF);
  Arena arena(CpuBackend::memory());
  Fp8Sizes sizes;
  sizes.input = size_t(N) * IC;
  sizes.grad = size_t(N) * OC;
  Fp8Experts experts{{0}, 3, 2, 1, W, 0};
  Fp8Linear<CpuBackend> fp8(o, 0, 1, false, &tp, nullptr, sizes, arena, experts);
  arena.allocate();
  fp8.bind();
  Fp8State& s = fp8.state();
  const int tx = s.expert_tensor(0, Fp8State::kFc1, Fp8State::kInput, 0);
  const int tg = s.expert_tensor(0, Fp8State::kFc1, Fp8State::kGrad, 0);
  auto tw = [&](int e) { return s.expert_tensor(0, Fp8State::kFc1, Fp8State::kWeight, e); };
  // Both experts forward and backward on their blocks of rows.
  struct Pass {
    std::vector<float> out, dx, dw[2], db;
  };
  auto pass = [&] {
    Pass p;
    p.out.assign(size_t(N) * OC, 0.0f);
    p.dx.assign(size_t(N) * IC, 0.0f);
    p.db.assign(size_t(2) * OC, 0.0f);
    fp8.expert_rows(0, Fp8State::kFc1, Fp8State::kInput, x.data(), x.size());
    for (int e = 0, r0 = 0; e < 2; r0 += n[e++])
      fp8.expert_forward(0, Fp8State::kFc1, e, p.out.data() + size_t(r0) * OC,
                         x.data() + size_t(r0) * IC, w[e].data(), b.data(), n[e], IC, OC);
    fp8.expert_rows(0, Fp8State::kFc1, Fp8State::kGrad, g.data(), g.size());
    for (int e = 0, r0 = 0; e < 2; r0 += n[e++]) {
      p.dw[e].assign(W, 0.0f);
      fp8.expert_backward(0, Fp8State::kFc1, e, p.dx.data() + size_t(r0) * IC, p.dw[e].data(),
                          p.db.data() + size_t(e) * OC, g.data() + size_t(r0) * OC,
                          x.data() + size_t(r0) * IC, w[e].data(), n[e], IC, OC);
    }
    return p;
  };

  // No histories: the compute type's products, and the amaxes recorded.
  EXPECT_FALSE(fp8.experts_fp8(0));
  const Pass first = pass();
  for (int e = 0, r0 = 0; e < 2; r0 += n[e++]) {
    std::vector<float> out(size_t(n[e]) * OC), dx(size_t(n[e]) * IC, 0.0f), dw(W, 0.0f), db(OC);
    cpu::matmul_forward(out.data(), x.data() + size_t(r0) * IC, w[e].data(), b.data(), n[e], IC, OC);
    cpu::matmul_backward(dx.data(), dw.data(), db.data(), g.data() + size_t(r0) * OC,
                         x.data() + size_t(r0) * IC, w[e].data(), n[e], IC, OC);
    EXPECT_EQ(out, std::vector<float>(first.out.begin() + long(r0) * OC,
                                      first.out.begin() + long(r0 + n[e]) * OC));
    EXPECT_EQ(dx, std::vector<float>(first.dx.begin() + long(r0) * IC,
                                     first.dx.begin() + long(r0 + n[e]) * IC));
    EXPECT_EQ(dw, first.dw[e]);
  }
  fp8.collect();
  EXPECT_EQ(s.pending()[size_t(tx)], amax(x.data(), x.size()));
  EXPECT_EQ(s.pending()[size_t(tg)], amax(g.data(), g.size()));
  EXPECT_EQ(s.pending()[size_t(tw(0))], 0.0f);  // expert 0 is another rank's
  EXPECT_EQ(s.pending()[size_t(tw(1))], amax(w[0].data(), W));
  EXPECT_EQ(s.pending()[size_t(tw(2))], amax(w[1].data(), W));
  s.commit();

  // With histories: on codes. The rows at one scale, each expert's weight at its own.
  ASSERT_TRUE(fp8.experts_fp8(0));
  const Pass second = pass();
  const float sx = 448.0f / amax(x.data(), x.size()), sg = 57344.0f / amax(g.data(), g.size());
  const std::vector<double> qx = coded(x.data(), x.size(), sx, Fp8Format::E4M3),
                            qg = coded(g.data(), g.size(), sg, Fp8Format::E5M2);
  // want(weight scale of each expert, row scales of each expert): the products in double.
  auto want = [&](const float sw[2], const float srow[2], std::vector<double>* out,
                  std::vector<double>* dx, std::vector<double> dw[2]) {
    out->assign(size_t(N) * OC, 0.0);
    dx->assign(size_t(N) * IC, 0.0);
    for (int e = 0, r0 = 0; e < 2; r0 += n[e++]) {
      const std::vector<double> qw = coded(w[e].data(), W, sw[e], Fp8Format::E4M3);
      const std::vector<double> rx = coded(x.data() + size_t(r0) * IC, size_t(n[e]) * IC,
                                           srow[e] * sx, Fp8Format::E4M3);
      const std::vector<double> rg = coded(g.data() + size_t(r0) * OC, size_t(n[e]) * OC,
                                           srow[e] * sg, Fp8Format::E5M2);
      dw[e].assign(W, 0.0);
      for (int r = 0; r < n[e]; ++r)
        for (int oc = 0; oc < OC; ++oc) {
          double sum = b[size_t(oc)];
          for (int i = 0; i < IC; ++i) {
            sum += rx[size_t(r) * IC + i] * qw[size_t(oc) * IC + i];
            (*dx)[size_t(r0 + r) * IC + i] += rg[size_t(r) * OC + oc] * qw[size_t(oc) * IC + i];
            dw[e][size_t(oc) * IC + i] += rg[size_t(r) * OC + oc] * rx[size_t(r) * IC + i];
          }
          (*out)[size_t(r0 + r) * OC + oc] = sum;
        }
    }
  };
  auto close = [](const std::vector<float>& got, const std::vector<double>& ref) {
    for (size_t i = 0; i < got.size(); ++i)
      if (std::fabs(got[i] - ref[i]) > 1e-6 * (1.0 + std::fabs(ref[i]))) return false;
    return true;
  };
  const float own[2] = {448.0f / amax(w[0].data(), W), 448.0f / amax(w[1].data(), W)};
  const float one[2] = {1.0f, 1.0f};
  std::vector<double> out, dx, dw[2];
  want(own, one, &out, &dx, dw);
  EXPECT_TRUE(close(second.out, out));
  EXPECT_TRUE(close(second.dx, dx));
  EXPECT_TRUE(close(second.dw[0], dw[0]));
  EXPECT_TRUE(close(second.dw[1], dw[1]));
  EXPECT_EQ(second.db, first.db);  // from the unquantized gradient
  EXPECT_FALSE(close(second.out, std::vector<double>(first.out.begin(), first.out.end())));
  // The largest expert's weight scale for both: expert 0's products differ.
  const float shared[2] = {own[1], own[1]};
  std::vector<double> out_s, dx_s, dw_s[2];
  want(shared, one, &out_s, &dx_s, dw_s);
  EXPECT_FALSE(close(second.out, out_s));
  // Each expert's rows at their own amax: expert 1's gradient rows (the smaller) differ.
  const float rows[2] = {1.0f, amax(g.data(), g.size()) /
                                   amax(g.data() + size_t(n[0]) * OC, size_t(n[1]) * OC)};
  std::vector<double> out_r, dx_r, dw_r[2];
  want(own, rows, &out_r, &dx_r, dw_r);
  EXPECT_FALSE(close(second.dx, dx_r) && close(second.dw[1], dw_r[1]));
}

// Under ZeRO-3 the held experts' codes of four MoE layers take turns in two MoE layers' places
// as the dense layers' do: after a step of histories, forward 0..3, backward 3..0 and layer 0's
// forward again give what a place for every layer's experts gives, from half the bytes.
TEST(Fp8Linear, UnderZero3TwoMoeLayersOfExpertCodesTakeTurns) {
  const int n = 3, IC = 5, OC = 4, L = 4, held = 2;
  const size_t W = size_t(OC) * IC;
  NormalValues random{std::mt19937(13)};
  std::vector<std::vector<float>> w;  // by layer then held expert
  for (int i = 0; i < L * held; ++i) w.push_back(random(W, 0.05f * float(i + 1)));
  const std::vector<float> x = random(size_t(n) * IC, 3.0f), g = random(size_t(n) * OC, 1e-4f);
  Comm tp(MPI_COMM_SELF);
  Fp8Sizes sizes;
  sizes.input = size_t(n) * IC;
  sizes.grad = size_t(n) * OC;
  auto run = [&](bool layer_codes) {
    Fp8Options o;
    o.on = true;
    o.layer_codes = layer_codes;
    Arena arena(CpuBackend::memory());
    Fp8Linear<CpuBackend> fp8(o, 0, L, false, &tp, nullptr, sizes, arena,
                              Fp8Experts{{0, 1, 2, 3}, 4, held, 2, W, W});
    arena.allocate();
    fp8.bind();
    Fp8State& s = fp8.state();
    for (int i = 0; i < s.tensors(); ++i) s.observe(i, 1.0f + 0.1f * float(i));
    s.commit();
    TurnsRun r;
    r.bytes = fp8.weight_bytes();
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < held; ++e) {
        r.out.emplace_back(size_t(n) * OC);
        fp8.expert_forward(l, Fp8State::kFc1, e, r.out.back().data(), x.data(),
                           w[size_t(l * held + e)].data(), nullptr, n, IC, OC);
      }
    for (int l = L - 1; l >= 0; --l)
      for (int e = 0; e < held; ++e) {
        r.dx.emplace_back(size_t(n) * IC, 0.0f);
        r.dw.emplace_back(W, 0.0f);
        fp8.expert_backward(l, Fp8State::kFc1, e, r.dx.back().data(), r.dw.back().data(), nullptr,
                            g.data(), x.data(), w[size_t(l * held + e)].data(), n, IC, OC);
      }
    r.again.resize(size_t(n) * OC);
    fp8.expert_forward(0, Fp8State::kFc1, 1, r.again.data(), x.data(), w[1].data(), nullptr, n,
                       IC, OC);
    fp8.collect();
    r.amax = fp8.state().pending();
    return r;
  };
  // Layer 0's expert 1, and layer 2's, its place-mate's.
  expect_turns_as_whole(run(false), run(true), 1, size_t(2 * held + 1));
}
