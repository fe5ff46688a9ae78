#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

void adamw_step(float* params, const float* grads, float* m, float* v, const ParamLayout& layout,
                const AdamWHyper& h, double lr, long t) {
  const float b1 = float(h.beta1), b2 = float(h.beta2);
  const double bc1 = 1.0 - std::pow(h.beta1, double(t));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, double(t)));
  const float step_size = float(lr / bc1);
  const float eps = float(h.eps);
  for (const ParamTensor& tensor : layout.tensors) {
    const float decay = tensor.weight_decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
    float* p = params + tensor.offset;
    const float* g = grads + tensor.offset;
    float* mt = m + tensor.offset;
    float* vt = v + tensor.offset;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < tensor.numel; ++i) {
      const float gi = g[i];
      mt[i] = b1 * mt[i] + (1.0f - b1) * gi;
      vt[i] = b2 * vt[i] + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(vt[i]) / float(bc2_sqrt) + eps;
      p[i] = p[i] * decay - step_size * mt[i] / denom;
    }
  }
}

double sum_of_squares(const float* x, size_t n) {
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
  return total;
}

void clip_gradients(float* grads, size_t n, double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  const float c = float(coef);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) grads[i] *= c;
}

}  // namespace tessera
