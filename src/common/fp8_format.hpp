#pragma once
// The two 8-bit floating-point formats of FP8 training ("FP8 Formats for Deep Learning",
// Micikevicius et al. 2022; CUDA's __nv_fp8_e4m3 and __nv_fp8_e5m2):
//
//   E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinity: S.1111.111 is NaN, so the
//         largest finite value is 1.75 x 2^8 = 448; subnormals down to 2^-9.
//   E5M2  sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is infinity,
//         S.11111.xx (xx != 0) NaN; the largest finite value is 1.75 x 2^15 = 57344; subnormals
//         down to 2^-16.
//
// fp8_round(x) is x rounded to the format's grid, as a float: round to nearest, ties to the even
// mantissa (0 is even, so a value up to half the smallest subnormal flushes to zero),
// saturating: a finite value or an infinity beyond the largest finite value becomes ±max (the
// recipe of Transformer Engine, and of cuBLASLt's FP8 output with saturation); NaN stays NaN.
// fp8_encode gives that value's code, fp8_decode a code's value: the CPU's FP8 GEMM inputs are
// these codes, as the GPU's (model/fp8.hpp).
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tessera {

enum class Fp8Format { E4M3, E5M2 };

struct Fp8Traits {
  int mantissa_bits, bias;
  float max;       // largest finite value
  int min_exp;     // exponent of the smallest normal value (1 - bias)
};

constexpr Fp8Traits fp8_traits(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Traits{3, 7, 448.0f, -6} : Fp8Traits{2, 15, 57344.0f, -14};
}

constexpr float fp8_max(Fp8Format f) { return fp8_traits(f).max; }

// The largest device.fp8_margin that keeps a tensor's amax, scaled to max / 2^margin, a normal
// number of the format, with its whole mantissa: E4M3 14 (448 / 2^14 >= 2^-6), E5M2 29. Beyond
// it the largest values are subnormal, and from E4M3's 19 on every value rounds to zero: a run
// would train on nothing.
constexpr int fp8_max_margin(Fp8Format f) {
  const Fp8Traits t = fp8_traits(f);
  double smallest_normal = 1, v = t.max;
  for (int e = t.min_exp; e < 0; ++e) smallest_normal /= 2;
  int margin = 0;
  for (; v / 2 >= smallest_normal; v /= 2) ++margin;
  return margin;
}
static_assert(fp8_max_margin(Fp8Format::E4M3) == 14 && fp8_max_margin(Fp8Format::E5M2) == 29);

// x on the format's grid (see the top of the file).
inline float fp8_round(float x, Fp8Format f) {
  const Fp8Traits t = fp8_traits(f);
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  if (a >= t.max) return std::copysign(t.max, x);
  float r;
  if (a < std::ldexp(1.0f, t.min_exp)) {
    // Subnormal range: multiples of the quantum 2^(min_exp - M); a / quantum is exact (a power
    // of two), nearbyint rounds half to even in the default rounding mode.
    const int q = t.min_exp - t.mantissa_bits;
    r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);
  } else {
    // Normal range: keep M of float's 23 mantissa bits, rounding the rest half to even; a carry
    // into the exponent is the right result (1.111|1 -> 10.000).
    uint32_t bits;
    std::memcpy(&bits, &a, 4);
    const int shift = 23 - t.mantissa_bits;
    bits += (uint32_t(1) << (shift - 1)) - 1 + ((bits >> shift) & 1);
    bits &= ~((uint32_t(1) << shift) - 1);
    std::memcpy(&r, &bits, 4);
    if (r > t.max) r = t.max;
  }
  return std::copysign(r, x);
}

// The code of fp8_round(x): NaN is 0x7F (E4M3's NaN; a NaN of E5M2 too).
inline uint8_t fp8_encode(float x, Fp8Format f) {
  const Fp8Traits t = fp8_traits(f);
  if (std::isnan(x)) return 0x7F;
  const float r = fp8_round(x, f), a = std::fabs(r);
  const uint8_t sign = std::signbit(r) ? 0x80 : 0;
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the unbiased exponent is e - 1
  const int M = t.mantissa_bits;
  if (e - 1 < t.min_exp)  // subnormal: exponent field 0, mantissa a / 2^(min_exp - M)
    return uint8_t(sign | int(std::ldexp(a, M - t.min_exp)));
  const int mant = int(std::ldexp(a, M - (e - 1))) - (1 << M);
  return uint8_t(sign | ((e - 1 + t.bias) << M) | mant);
}

inline float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8Traits t = fp8_traits(f);
  const int M = t.mantissa_bits, E = 7 - M;
  const int exp = (code >> M) & ((1 << E) - 1), mant = code & ((1 << M) - 1);
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (f == Fp8Format::E4M3 && exp == 15 && mant == 7) return NAN;
  if (f == Fp8Format::E5M2 && exp == 31) return mant == 0 ? sign * INFINITY : NAN;
  if (exp == 0) return sign * std::ldexp(float(mant), t.min_exp - M);
  return sign * std::ldexp(float((1 << M) + mant), exp - t.bias - M);
}

// One operand of an FP8 GEMM (Backend::fp8_gemm): rows of K codes each (K-contiguous, what
// cuBLASLt's FP8 kernels take), their format, and where the backend keeps the factor that turns
// codes back into the tensor's values (1 / the quantizing scale; device memory on a GPU, where
// cuBLASLt reads it as the operand's scale pointer).
struct Fp8Operand {
  const uint8_t* codes;
  Fp8Format format;
  const float* scale_inv;
};

}  // namespace tessera
