// Token + position embedding.
#include <algorithm>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

static constexpr int kColBlock = 64;

// out (B,T,C) = wte[tokens[b,t] - v0, :] + wpe[pos, :]; tokens (B,T); wte (vcount,C) holds the
// vocabulary rows [v0, v0 + vcount): a token outside them contributes 0 (vocab-parallel: another
// tensor-parallel rank holds its row and the sum over ranks completes it). wpe or nullptr; pos
// positions[b*T + t], or t.
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C,
                     int v0, int vcount, const int32_t* positions) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      F* o = out + ((size_t)b * T + t) * C;
      const int row = tokens[b * T + t] - v0;
      const F* e = row >= 0 && row < vcount ? wte + (size_t)row * C : nullptr;
      const size_t pos = positions ? (size_t)positions[b * T + t] : (size_t)t;
      const F* p = wpe ? wpe + pos * C : nullptr;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = (e ? e[c] : F(0)) + (p ? p[c] : F(0));
    }
  }
}

// dout (B,T,C), tokens (B,T). Accumulates dwte (vcount,C) for the tokens in [v0, v0 + vcount)
// and dwpe unless it is nullptr (rows by positions, as the forward).
// Tokens repeat, so threads split the channels, never the tokens: each thread owns a slice of
// columns of dwte and dwpe, walks all positions in order, and no two threads touch one element.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C,
                      int v0, int vcount, const int32_t* positions) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const F* d = dout + ((size_t)b * T + t) * C;
        const int row = tokens[b * T + t] - v0;
        if (row >= 0 && row < vcount) {
          F* e = dwte + (size_t)row * C;
#pragma omp simd
          for (int c = c0; c < c1; c++) e[c] += d[c];
        }
        if (dwpe) {
          F* p = dwpe + (positions ? (size_t)positions[b * T + t] : (size_t)t) * C;
#pragma omp simd
          for (int c = c0; c < c1; c++) p[c] += d[c];
        }
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int, int, int,  \
                                   const int32_t*);                                                \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, int, int, int, int, int,     \
                                    const int32_t*);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
