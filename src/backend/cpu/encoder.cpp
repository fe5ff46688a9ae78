// Token + position embedding.
#include <algorithm>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

static constexpr int kColBlock = 64;

// out (B,T,C) = wte[tokens[b,t], :] + wpe[t, :]; tokens (B,T), wte (V,C), wpe (>=T,C).
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      F* o = out + ((size_t)b * T + t) * C;
      const F* e = wte + (size_t)tokens[b * T + t] * C;
      const F* p = wpe + (size_t)t * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
  }
}

// dout (B,T,C), tokens (B,T). Accumulates dwte (V,C) and dwpe (>=T,C).
// Tokens repeat, so threads split the channels, never the tokens: each thread owns a slice of
// columns of dwte and dwpe, walks all positions in order, and no two threads touch one element.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const F* d = dout + ((size_t)b * T + t) * C;
        F* e = dwte + (size_t)tokens[b * T + t] * C;
        F* p = dwpe + (size_t)t * C;
#pragma omp simd
        for (int c = c0; c < c1; c++) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int);        \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
