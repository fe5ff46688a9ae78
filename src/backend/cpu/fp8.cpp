// FP8 simulated on the CPU (device.precision: fp8 with device.backend: cpu): a tensor's absolute
// maximum, and its values rounded to an FP8 grid at a scale and back to fp32.
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

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

void fp8_quantize(float* out, const float* in, size_t n, float scale, Fp8Format format) {
  const float inv = 1.0f / scale;  // the dequantizing factor (Transformer Engine's scale_inv)
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = fp8_round(in[i] * scale, format) * inv;
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
