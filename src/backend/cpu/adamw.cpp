// AdamW and the pieces of global-norm gradient clipping; the CUDA twin is adamw.cu.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

namespace {

// The update of elements [0, n), with or without the parameters' copy. One pass, each element on
// its own, so the compiler vectorizes it (sqrt sets no errno: -fno-math-errno for
// src/backend/cpu/, the Makefile): the same IEEE operations per element as a scalar loop, 2x
// faster on a 2-core EPYC, where the scalar loop's sqrt and division held the pass at half the
// memory bandwidth (docs/benchmarks.md, the step's breakdown).
template <bool kCopy>
void adamw_elements(float* __restrict p, float* __restrict copy, const float* __restrict g,
                    float* __restrict m, float* __restrict v, size_t n, float b1, float b2,
                    float bc2_sqrt, float step_size, float eps, float keep) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    const float pi = p[i] * keep - step_size * mi / denom;
    p[i] = pi;
    if constexpr (kCopy) copy[i] = pi;
  }
}

}  // namespace

void adamw_update(float* p, float* copy, const float* g, float* m, float* v, size_t n, bool decay,
                  const AdamWHyper& h, double lr, long t) {
  const float b1 = float(h.beta1), b2 = float(h.beta2);
  const double bc1 = 1.0 - std::pow(h.beta1, double(t));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(h.beta2, double(t))));
  const float step_size = float(lr / bc1);
  const float eps = float(h.eps);
  const float keep = decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
  if (copy)
    adamw_elements<true>(p, copy, g, m, v, n, b1, b2, bc2_sqrt, step_size, eps, keep);
  else
    adamw_elements<false>(p, copy, g, m, v, n, b1, b2, bc2_sqrt, step_size, eps, keep);
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
