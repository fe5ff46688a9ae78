// Causal grouped-query self-attention on a packed qkv buffer, every product through gemm.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// Rows are processed in blocks: a block of query rows [i0,i1) only needs keys [0,i1), so the
// products skip almost all of the masked upper triangle (about half the work for large T) while
// each gemm stays large enough for BLAS to run at speed.
static constexpr int kRowBlock = 64;

// qkv (B,T,(NH+2*NKV)*hs): q heads, then k heads, then v heads (backend/cpu/ops.hpp); query head
// h reads kv head h / (NH/NKV). att (B,NH,T,T) = causal softmax(q·kᵀ/sqrt(hs)), exactly 0 above
// the diagonal and, with doc_start (B,T), before the query's document start. out (B,T,NH*hs) =
// att·v with query head h in cols [h*hs,(h+1)*hs). Overwrites out and att. One (b,h) pair per
// task: query heads write disjoint columns and att slabs, so there is nothing to reduce across
// them.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int NH, int NKV, int hs,
                       const int32_t* doc_start) {
  const int G = NH / NKV, C3 = (NH + 2 * NKV) * hs, Cq = NH * hs;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const F* row = qkv + (size_t)b * T * C3;
      const F* q = row + (size_t)h * hs;
      const F* k = row + (size_t)(NH + h / G) * hs;
      const F* v = k + (size_t)NKV * hs;
      F* a = att + ((size_t)b * NH + h) * T * T;
      F* o = out + (size_t)b * T * Cq + (size_t)h * hs;
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        // scores a[i0:i1, 0:i1] = scale * q[i0:i1] · k[0:i1]ᵀ
        gemm<F>(false, true, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, F(0),
                a + (size_t)i0 * T, T);
        for (int i = i0; i < i1; i++) {
          F* arow = a + (size_t)i * T;
          const int s0 = doc_start ? doc_start[(size_t)b * T + i] : 0;
          F mx = arow[s0];
#pragma omp simd reduction(max : mx)
          for (int j = s0 + 1; j <= i; j++) mx = std::max(mx, arow[j]);
          double sum = 0.0;
          for (int j = s0; j <= i; j++) {
            arow[j] = std::exp(arow[j] - mx);
            sum += arow[j];
          }
          const F inv = F(1.0 / sum);
          for (int j = s0; j <= i; j++) arow[j] *= inv;
          std::fill(arow, arow + s0, F(0));
          std::fill(arow + i + 1, arow + T, F(0));
        }
        // o[i0:i1] = a[i0:i1, 0:i1] · v[0:i1]
        gemm<F>(false, false, i1 - i0, hs, i1, F(1), a + (size_t)i0 * T, T, v, C3, F(0),
                o + (size_t)i0 * Cq, Cq);
      }
    }
  }
}

// dout (B,T,NH*hs), qkv and att (B,NH,T,T) from the forward. Accumulates dqkv; datt (B,NH,T,T)
// is scratch: it first holds d(att), then d(pre-softmax scores). A document mask needs nothing
// here: the probabilities it hid are 0 in att, and so are their score gradients.
// Two passes: dq by (b, query head), then dk and dv by (b, kv head), each kv head summing its
// query heads in order, so no two tasks write one element and every sum has a fixed order.
template <typename F>
void attention_backward(F* dqkv, F* datt, const F* dout, const F* qkv, const F* att, int B, int T,
                        int NH, int NKV, int hs) {
  const int G = NH / NKV, C3 = (NH + 2 * NKV) * hs, Cq = NH * hs;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
      const size_t koff = (size_t)b * T * C3 + (size_t)(NH + h / G) * hs;
      const F* k = qkv + koff;
      const F* v = k + (size_t)NKV * hs;
      F* dq = dqkv + qoff;
      const F* a = att + ((size_t)b * NH + h) * T * T;
      F* da = datt + ((size_t)b * NH + h) * T * T;
      const F* d = dout + (size_t)b * T * Cq + (size_t)h * hs;
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        // da[i0:i1, 0:i1] = d[i0:i1] · v[0:i1]ᵀ
        gemm<F>(false, true, i1 - i0, i1, hs, F(1), d + (size_t)i0 * Cq, Cq, v, C3, F(0),
                da + (size_t)i0 * T, T);
        // softmax backward in place: dpre = a * (da - Σ_j a·da); zero above the diagonal so the
        // block products below may read whole blocks.
        for (int i = i0; i < i1; i++) {
          const F* arow = a + (size_t)i * T;
          F* drow = da + (size_t)i * T;
          double dot = 0.0;
          for (int j = 0; j <= i; j++) dot += (double)arow[j] * drow[j];
          const F dotf = F(dot);
          for (int j = 0; j <= i; j++) drow[j] = arow[j] * (drow[j] - dotf);
          std::fill(drow + i + 1, drow + i1, F(0));
        }
        // dq[i0:i1] += scale * dpre[i0:i1, 0:i1] · k[0:i1]
        gemm<F>(false, false, i1 - i0, hs, i1, scale, da + (size_t)i0 * T, T, k, C3, F(1),
                dq + (size_t)i0 * C3, C3);
      }
    }
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < NKV; g++) {
      F* dk = dqkv + (size_t)b * T * C3 + (size_t)(NH + g) * hs;
      F* dv = dk + (size_t)NKV * hs;
      for (int h = g * G; h < (g + 1) * G; h++) {
        const F* q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const F* a = att + ((size_t)b * NH + h) * T * T;
        const F* da = datt + ((size_t)b * NH + h) * T * T;
        const F* d = dout + (size_t)b * T * Cq + (size_t)h * hs;
        // Rows j of dk and dv only see query rows i >= j: block the key rows instead.
        for (int j0 = 0; j0 < T; j0 += kRowBlock) {
          const int j1 = std::min(T, j0 + kRowBlock);
          // dv[j0:j1] += a[j0:T, j0:j1]ᵀ · d[j0:T]
          gemm<F>(true, false, j1 - j0, hs, T - j0, F(1), a + (size_t)j0 * T + j0, T,
                  d + (size_t)j0 * Cq, Cq, F(1), dv + (size_t)j0 * C3, C3);
          // dk[j0:j1] += scale * dpre[j0:T, j0:j1]ᵀ · q[j0:T]
          gemm<F>(true, false, j1 - j0, hs, T - j0, scale, da + (size_t)j0 * T + j0, T,
                  q + (size_t)j0 * C3, C3, F(1), dk + (size_t)j0 * C3, C3);
        }
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int, int, const int32_t*);  \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int, int,    \
                                      int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
