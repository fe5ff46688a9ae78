// Adafactor's pieces on the device; twin of backend/cpu/adafactor.cpp (backend/adafactor.hpp
// gives the rule). No atomics: every output has one thread or block that adds in a fixed order.
// The pointers go to the kernels one by one (not inside SecondMoment), so that the emulator
// checks and orders each of them.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// Element k of a piece before clipping: G / sqrt(estimate), as the CPU twin computes it. A vector
// (v not null) reads its v, which the rms pass updated.
__device__ __forceinline__ float unclipped(float g, const float* row, const float* col,
                                           const float* row_mean, const MatrixWindow& w,
                                           const float* v, size_t k) {
  if (v != nullptr) return g / sqrtf(v[k]);
  const size_t i = w.first + k, r = w.row0 + i / w.cols, c = w.col0 + i % w.cols;
  const float r_factor = 1.0f / sqrtf(row[r] / *row_mean);
  const float c_factor = 1.0f / sqrtf(col[c]);
  return g * r_factor * c_factor;
}

// One block per local row the piece touches (r0 + blockIdx.x): its elements' squares in double.
__global__ void row_sums_kernel(float* row_sums, const float* g, size_t n, MatrixWindow w,
                                size_t r0) {
  TESSERA_SHARED(double, shared, [kWarp]);
  const size_t r = r0 + blockIdx.x, end = w.first + n;
  const size_t a = r * w.cols > w.first ? r * w.cols : w.first;
  const size_t b = (r + 1) * w.cols < end ? (r + 1) * w.cols : end;
  double s = 0.0;
  for (size_t i = a + threadIdx.x; i < b; i += blockDim.x) {
    const double x = g[i - w.first];
    s += x * x;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) row_sums[w.row0 + r] += float(s);
}

// First pass of the column sums: block (x, y) sums columns x * blockDim.x + tid over chunk y of
// the local rows (rows_per_chunk of them, in order) into partial[y * cols + column]; the second
// (add_column_partials, common.cuh) adds the chunks in order. Neighbouring threads read
// neighbouring columns, and enough blocks run for a tall matrix (the vocabulary's rows).
__global__ void col_partials_kernel(float* partial, const float* g, size_t n, MatrixWindow w,
                                    size_t r0, size_t r1, size_t rows_per_chunk) {
  const size_t c = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (c >= w.cols) return;
  const size_t end = w.first + n, from = r0 + blockIdx.y * rows_per_chunk;
  const size_t to = from + rows_per_chunk < r1 ? from + rows_per_chunk : r1;
  double s = 0.0;
  for (size_t r = from; r < to; ++r) {
    const size_t i = r * w.cols + c;
    if (i >= w.first && i < end) {
      const double x = g[i - w.first];
      s += x * x;
    }
  }
  partial[blockIdx.y * w.cols + c] = float(s);
}

// One block: the statistics' moving averages and mean(row).
__global__ void factors_kernel(float* row, float* col, float* row_mean, const float* row_sums,
                               const float* col_sums, size_t rows, size_t cols, float b2,
                               float eps, float inv_cols, float inv_rows) {
  TESSERA_SHARED(double, shared, [kWarp]);
  double s = 0.0;
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
    row[i] = b2 * row[i] + (1.0f - b2) * (row_sums[i] * inv_cols + eps);
    s += row[i];
  }
  for (size_t j = threadIdx.x; j < cols; j += blockDim.x)
    col[j] = b2 * col[j] + (1.0f - b2) * (col_sums[j] * inv_rows + eps);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *row_mean = float(s / double(rows));
}

// First pass of Σ U²: a fixed grid, as sum_of_squares's; a vector's v is updated on the way.
__global__ void rms_partial_kernel(double* partial, const float* g, const float* row,
                                   const float* col, const float* row_mean, MatrixWindow w,
                                   float* v, size_t n, float b2, float eps) {
  TESSERA_SHARED(double, shared, [kWarp]);
  double s = 0.0;
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n;
       k += size_t(gridDim.x) * blockDim.x) {
    if (v != nullptr) v[k] = b2 * v[k] + (1.0f - b2) * (g[k] * g[k] + eps);
    const double u = unclipped(g[k], row, col, row_mean, w, v, k);
    s += u * u;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void add_partials_kernel(double* acc, const double* partial, int count) {
  TESSERA_SHARED(double, shared, [kWarp]);
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *acc += s;
}

template <typename C>
__global__ void update_kernel(float* params, C* params_copy, const float* g, float* m,
                              const float* row, const float* col, const float* row_mean,
                              MatrixWindow w, const float* v, size_t n, float b1, float step,
                              float keep, float inv_clip) {
  const size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  float u = unclipped(g[k], row, col, row_mean, w, v, k) * inv_clip;
  if (m != nullptr) {
    m[k] = b1 * m[k] + (1.0f - b1) * u;
    u = m[k];
  }
  params[k] = params[k] * keep - step * u;
  if (params_copy != nullptr) params_copy[k] = from_float<C>(params[k]);
}

}  // namespace

void adafactor_sums(float* row_sums, float* col_sums, const float* g, size_t n,
                    const MatrixWindow& w) {
  if (n == 0) return;
  const size_t r0 = w.first / w.cols, r1 = (w.first + n + w.cols - 1) / w.cols;
  launch<row_sums_kernel>(unsigned(r1 - r0), kThreads, 0, stream(), row_sums, g, n, w, r0);
  CUDA_CHECK_LAUNCH();
  const ColumnSplit split = column_split(int(r1 - r0), int(w.cols), 1);
  launch<col_partials_kernel>(dim3(blocks_for(w.cols, kThreads), unsigned(split.chunks)),
                              kThreads, 0, stream(), column_scratch(), g, n, w, r0, r1,
                              size_t(split.rows_per_chunk));
  CUDA_CHECK_LAUNCH();
  add_column_partials(col_sums + w.col0, column_scratch(), split.chunks, int(w.cols));
}

void adafactor_factors(float* row, float* col, float* row_mean, const float* row_sums,
                       const float* col_sums, size_t rows, size_t cols, const AdafactorHyper& h,
                       long t) {
  launch<factors_kernel>(1, 1024, 0, stream(), row, col, row_mean, row_sums, col_sums, rows, cols,
                         float(h.beta2(t)), float(h.eps), float(1.0 / double(cols)),
                         float(1.0 / double(rows)));
  CUDA_CHECK_LAUNCH();
}

void adafactor_rms(double* acc, const float* g, const SecondMoment& s, size_t n,
                   const AdafactorHyper& h, long t) {
  if (n == 0) return;
  constexpr int kReduceThreads = 512;
  const size_t want = (n + kReduceThreads - 1) / kReduceThreads;
  const int grid = int(want < size_t(kScratchDoubles) ? want : size_t(kScratchDoubles));
  double* partial = scratch();
  launch<rms_partial_kernel>(grid, kReduceThreads, 0, stream(), partial, g, s.row, s.col,
                             s.row_mean, s.window, s.v, n, float(h.beta2(t)), float(h.eps));
  CUDA_CHECK_LAUNCH();
  launch<add_partials_kernel>(1, kReduceThreads, 0, stream(), acc,
                              static_cast<const double*>(partial), grid);
  CUDA_CHECK_LAUNCH();
}

template <typename C>
void adafactor_update(float* params, C* params_copy, const float* g, float* m,
                      const SecondMoment& s, size_t n, bool decay, const AdafactorHyper& h,
                      double lr, float inv_clip) {
  if (n == 0) return;
  const float keep = decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
  launch<update_kernel<C>>(blocks_for(n, kThreads), kThreads, 0, stream(), params, params_copy, g,
                           m, s.row, s.col, s.row_mean, s.window,
                           static_cast<const float*>(s.v), n, float(h.beta1), float(lr), keep,
                           inv_clip);
  CUDA_CHECK_LAUNCH();
}

template void adafactor_update<float>(float*, float*, const float*, float*, const SecondMoment&,
                                      size_t, bool, const AdafactorHyper&, double, float);
template void adafactor_update<bf16>(float*, bf16*, const float*, float*, const SecondMoment&,
                                     size_t, bool, const AdafactorHyper&, double, float);

}  // namespace tessera::cuda
