// FP8 simulated on the CPU (device.precision: fp8 with device.backend: cpu): a tensor's absolute
// maximum, its FP8 codes at a scale, and the GEMM of two code matrices as cuBLASLt defines it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

namespace {

// The values of all 256 codes of a format.
const float* code_values(Fp8Format f) {
  static const auto table = [] {
    std::vector<float> t(512);
    for (int c = 0; c < 256; c++) {
      t[size_t(c)] = fp8_decode(uint8_t(c), Fp8Format::E4M3);
      t[256 + size_t(c)] = fp8_decode(uint8_t(c), Fp8Format::E5M2);
    }
    return t;
  }();
  return table.data() + (f == Fp8Format::E4M3 ? 0 : 256);
}

// An operand's codes as their (unscaled) values, in a buffer kept for the next call.
const float* values(std::vector<float>& buffer, const Fp8Operand& a, size_t n) {
  buffer.resize(n);
  const float* v = code_values(a.format);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) buffer[i] = v[a.codes[i]];
  return buffer.data();
}

}  // namespace

float fp8_amax(const float* x, size_t n) {
  float m = 0;
  int nan = 0;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(| : nan)
  for (size_t i = 0; i < n; i++) {
    const float a = std::fabs(x[i]);
    nan |= std::isnan(a);
    m = a > m ? a : m;
  }
  return nan ? NAN : m;
}

void fp8_cast(uint8_t* out, uint8_t* out_t, const float* in, int rows, int cols, float scale,
              Fp8Format format, float* amax, float* scale_inv) {
  // One pass, as the GPU's: the amax folded while the codes are written.
  float m = 0;
  int nan = 0;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(| : nan)
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const float x = in[size_t(r) * cols + c], a = std::fabs(x);
      nan |= std::isnan(a);
      m = a > m ? a : m;
      const uint8_t code = fp8_encode(x * scale, format);
      if (out) out[size_t(r) * cols + c] = code;
      if (out_t) out_t[size_t(c) * rows + r] = code;
    }
  *amax = nan || std::isnan(*amax) ? NAN : std::fmax(*amax, m);
  *scale_inv = 1.0f / scale;
}

void fp8_place(uint8_t* out, uint8_t* out_t, const uint8_t* in, int rows, int cols, float scale_inv,
               float* scale_inv_slot) {
  std::copy(in, in + size_t(rows) * size_t(cols), out);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) out_t[size_t(c) * rows + r] = in[size_t(r) * cols + c];
  *scale_inv_slot = scale_inv;
}

void fp8_gemm(float* d, const Fp8Operand& x, const Fp8Operand& y, int M, int N, int K,
              const float* bias, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  // Products of two FP8 values are exact in fp32 (at most 4 x 4 significant bits), as on the
  // tensor cores; only the sums round.
  thread_local std::vector<float> xs, ys;
  const float* xv = values(xs, x, size_t(M) * size_t(K));
  const float* yv = values(ys, y, size_t(N) * size_t(K));
  const float alpha = *x.scale_inv * *y.scale_inv;
  const int ld = K > 0 ? K : 1;
  gemm<float>(false, true, M, N, K, alpha, xv, ld, yv, ld, accumulate ? 1.0f : 0.0f, d, N);
  if (bias)
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++)
      for (int c = 0; c < N; c++) d[size_t(r) * N + c] += bias[c];
}

// dbias (OC) += colsum(dout (N,OC)), in the order matmul_backward sums its bias: rows in order,
// per column.
void bias_backward(float* dbias, const float* dout, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o++) {
    float sum = 0;
    for (int r = 0; r < N; r++) sum += dout[size_t(r) * OC + o];
    dbias[o] += sum;
  }
}

}  // namespace tessera::cpu
