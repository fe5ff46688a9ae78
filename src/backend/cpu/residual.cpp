// Elementwise sums of the residual stream, and the column copies of context parallelism.
#include <algorithm>
#include <cstring>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// out = a + b, all (n).
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// dst (n) += src (n); the residual stream's backward adds the same gradient into both branches.
template <typename F>
void add_inplace(F* dst, const F* src, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

// Columns [0, cols) of each row: dst (rows ld_dst apart) = / += src (rows ld_src apart).
template <typename F>
void copy_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols) {
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; r++)
    std::memcpy(dst + r * ld_dst, src + r * ld_src, cols * sizeof(F));
}

template <typename F>
void add_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols) {
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++) dst[r * ld_dst + c] += src[r * ld_src + c];
}

void fill(float* x, size_t n, float value) { std::fill(x, x + n, value); }

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                              \
  template void add_inplace<F>(F*, const F*, size_t);                                            \
  template void copy_columns<F>(F*, size_t, const F*, size_t, size_t, size_t);                    \
  template void add_columns<F>(F*, size_t, const F*, size_t, size_t, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
