// Elementwise sums of the residual stream.
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

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                              \
  template void add_inplace<F>(F*, const F*, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
