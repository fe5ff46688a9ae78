// Adafactor's pieces (backend/adafactor.hpp gives the rule); the CUDA twin is adafactor.cu.
// Every sum has a fixed order that depends on the shapes alone, not on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

namespace {

// The update before clipping of element k of a piece: G / sqrt(estimate). A vector's v is read
// as it is (adafactor_rms updated it).
inline float unclipped(float g, const SecondMoment& s, size_t k) {
  if (!s.factored()) return g / std::sqrt(s.v[k]);
  const MatrixWindow& w = s.window;
  const size_t i = w.first + k, r = w.row0 + i / w.cols, c = w.col0 + i % w.cols;
  const float r_factor = 1.0f / std::sqrt(s.row[r] / *s.row_mean);
  const float c_factor = 1.0f / std::sqrt(s.col[c]);
  return g * r_factor * c_factor;
}

}  // namespace

void adafactor_sums(float* row_sums, float* col_sums, const float* g, size_t n,
                    const MatrixWindow& w) {
  if (n == 0) return;
  const size_t end = w.first + n, r0 = w.first / w.cols, r1 = (end + w.cols - 1) / w.cols;
  // Each local row's sum, then each column's over the rows: one thread per output.
#pragma omp parallel for schedule(static)
  for (size_t r = r0; r < r1; ++r) {
    const size_t a = std::max(w.first, r * w.cols), b = std::min(end, (r + 1) * w.cols);
    double s = 0.0;
    for (size_t i = a; i < b; ++i) s += double(g[i - w.first]) * g[i - w.first];
    row_sums[w.row0 + r] += float(s);
  }
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < w.cols; ++c) {
    double s = 0.0;
    for (size_t r = r0; r < r1; ++r) {
      const size_t i = r * w.cols + c;
      if (i >= w.first && i < end) s += double(g[i - w.first]) * g[i - w.first];
    }
    col_sums[w.col0 + c] += float(s);
  }
}

void adafactor_factors(float* row, float* col, float* row_mean, const float* row_sums,
                       const float* col_sums, size_t rows, size_t cols, const AdafactorHyper& h,
                       long t) {
  const float b2 = float(h.beta2(t)), eps = float(h.eps);
  const float inv_cols = float(1.0 / double(cols)), inv_rows = float(1.0 / double(rows));
  double sum = 0.0;
  for (size_t i = 0; i < rows; ++i) {
    row[i] = b2 * row[i] + (1.0f - b2) * (row_sums[i] * inv_cols + eps);
    sum += row[i];
  }
  for (size_t j = 0; j < cols; ++j)
    col[j] = b2 * col[j] + (1.0f - b2) * (col_sums[j] * inv_rows + eps);
  *row_mean = float(sum / double(rows));
}

void adafactor_rms(double* acc, const float* g, const SecondMoment& s, size_t n,
                   const AdafactorHyper& h, long t) {
  if (n == 0) return;
  if (!s.factored()) {
    const float b2 = float(h.beta2(t)), eps = float(h.eps);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; ++k) s.v[k] = b2 * s.v[k] + (1.0f - b2) * (g[k] * g[k] + eps);
  }
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    double sum = 0.0;
    for (size_t k = c * kChunk; k < std::min(n, (c + 1) * kChunk); ++k) {
      const double u = unclipped(g[k], s, k);
      sum += u * u;
    }
    partial[c] = sum;
  }
  for (double p : partial) *acc += p;
}

void adafactor_update(float* p, float* copy, const float* g, float* m, const SecondMoment& s,
                      size_t n, bool decay, const AdafactorHyper& h, double lr, float inv_clip) {
  const float b1 = float(h.beta1), step = float(lr);
  const float keep = decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < n; ++k) {
    float u = unclipped(g[k], s, k) * inv_clip;
    if (m) {
      m[k] = b1 * m[k] + (1.0f - b1) * u;
      u = m[k];
    }
    p[k] = p[k] * keep - step * u;
    if (copy) copy[k] = p[k];
  }
}

}  // namespace tessera::cpu
