// AdamW and the pieces of global-norm gradient clipping; the CUDA twin is adamw.cu.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

void adamw_update(float* p, float* copy, const float* g, float* m, float* v, size_t n, bool decay,
                  const AdamWHyper& h, double lr, long t) {
  const float b1 = float(h.beta1), b2 = float(h.beta2);
  const double bc1 = 1.0 - std::pow(h.beta1, double(t));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(h.beta2, double(t))));
  const float step_size = float(lr / bc1);
  const float eps = float(h.eps);
  const float keep = decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] * keep - step_size * m[i] / denom;
    if (copy) copy[i] = p[i];
  }
}

void sum_of_squares(double* acc, const float* x, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (size_t i = c * kChunk; i < end; ++i) s += double(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  *acc += total;
}

void scale(float* x, size_t n, float factor) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace tessera::cpu
