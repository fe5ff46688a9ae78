// Context parallelism's attention blocks (model/context_attention.hpp): the queries of one chunk
// of positions against the keys and values of another, merged into the running output by their
// log-sum-exp (the fused attention's online softmax), and the block's backward.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// Query rows per piece: a piece's scores (kRows x rows) are the only chunk-long temporaries.
static constexpr int kRows = 64;

// The block's first key query row i of sequence b sees: 0, or under a document mask the key at
// its document's start (past the block's end when the document starts after it).
static int first_key(const AttentionBlock& s, int b, int i) {
  if (!s.q_start) return 0;
  return std::max(0, s.q_start[(size_t)b * s.bstart + i] - s.k_pos);
}

template <typename F>
void attention_block_forward(F* out, F* lse, const F* q, const F* kv, const AttentionBlock& s) {
  const int G = s.NH / s.NKV, hs = s.hs, T = s.rows;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const F* qh = q + b * s.bq + (size_t)h * hs;
      const F* k = kv + b * s.bkv + (size_t)(h / G) * hs;
      const F* v = k + (size_t)s.NKV * hs;
      F* o = out + b * s.bo + (size_t)h * hs;
      F* row_lse = lse + ((size_t)b * s.NH + h) * s.t_lse;
      std::vector<F> p((size_t)std::min(T, kRows) * T), ob((size_t)std::min(T, kRows) * hs);
      for (int i0 = 0; i0 < T; i0 += kRows) {
        const int i1 = std::min(T, i0 + kRows), nk = s.diagonal ? i1 : T;
        gemm<F>(false, true, i1 - i0, nk, hs, scale, qh + (size_t)i0 * s.ldq, s.ldq, k, s.ldkv,
                F(0), p.data(), nk);
        std::vector<F> blk_lse(size_t(i1 - i0));
        for (int i = i0; i < i1; i++) {
          F* prow = p.data() + (size_t)(i - i0) * nk;
          const int first = first_key(s, b, i), last = s.diagonal ? i : T - 1;
          std::fill(prow, prow + std::min(first, nk), F(0));
          if (first > last) {  // the query's document starts after this block
            std::fill(prow, prow + nk, F(0));
            blk_lse[size_t(i - i0)] = -std::numeric_limits<F>::infinity();
            continue;
          }
          F mx = prow[first];
          for (int j = first + 1; j <= last; j++) mx = std::max(mx, prow[j]);
          double sum = 0.0;
          for (int j = first; j <= last; j++) {
            prow[j] = std::exp(prow[j] - mx);
            sum += prow[j];
          }
          const F inv = F(1.0 / sum);
          for (int j = first; j <= last; j++) prow[j] *= inv;
          std::fill(prow + last + 1, prow + nk, F(0));
          blk_lse[size_t(i - i0)] = F(mx + std::log(sum));
        }
        gemm<F>(false, false, i1 - i0, hs, nk, F(1), p.data(), nk, v, s.ldkv, F(0), ob.data(),
                hs);
        // out = out * exp(lse - new) + block * exp(block_lse - new), new = log(e^lse + e^block)
        for (int i = i0; i < i1; i++) {
          const double a = row_lse[i], c = blk_lse[size_t(i - i0)];
          if (c == -std::numeric_limits<double>::infinity()) continue;
          const double m = std::max(a, c);
          const double wa = std::exp(a - m), wc = std::exp(c - m), tot = wa + wc;
          const F fa = F(wa / tot), fc = F(wc / tot);
          F* orow = o + (size_t)i * s.ldo;
          const F* brow = ob.data() + (size_t)(i - i0) * hs;
          for (int c2 = 0; c2 < hs; c2++) orow[c2] = orow[c2] * fa + brow[c2] * fc;
          row_lse[i] = F(m + std::log(tot));
        }
      }
    }
  }
}

template <typename F>
void attention_delta(F* delta, const F* dout, const F* out, int B, int T, int NH, int hs, int ldo) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        const size_t at = ((size_t)b * T + t) * ldo + (size_t)h * hs;
        double dot = 0.0;
        for (int c = 0; c < hs; c++) dot += (double)dout[at + c] * out[at + c];
        delta[((size_t)b * NH + h) * T + t] = F(dot);
      }
    }
  }
}

// One (b, kv head) per task, its query heads in order: dk and dv have one writer each.
template <typename F>
void attention_block_backward(F* dq, F* dkv, const F* dout, const F* delta, const F* q,
                              const F* kv, const F* lse, const AttentionBlock& s) {
  const int G = s.NH / s.NKV, hs = s.hs, T = s.rows;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < s.B; b++) {
    for (int g = 0; g < s.NKV; g++) {
      const size_t koff = b * s.bkv + (size_t)g * hs;
      const F* k = kv + koff;
      const F* v = k + (size_t)s.NKV * hs;
      F* dk = dkv + koff;
      F* dv = dk + (size_t)s.NKV * hs;
      const size_t block = (size_t)std::min(T, kRows) * T;
      std::vector<F> p(block), ds(block);
      for (int h = g * G; h < (g + 1) * G; h++) {
        const F* qh = q + b * s.bq + (size_t)h * hs;
        F* dqh = dq + b * s.bq + (size_t)h * hs;
        const F* d = dout + b * s.bo + (size_t)h * hs;
        const F* row_lse = lse + ((size_t)b * s.NH + h) * s.t_lse;
        const F* row_delta = delta + ((size_t)b * s.NH + h) * s.t_lse;
        for (int i0 = 0; i0 < T; i0 += kRows) {
          const int i1 = std::min(T, i0 + kRows), nk = s.diagonal ? i1 : T;
          gemm<F>(false, true, i1 - i0, nk, hs, scale, qh + (size_t)i0 * s.ldq, s.ldq, k, s.ldkv,
                  F(0), p.data(), nk);
          gemm<F>(false, true, i1 - i0, nk, hs, F(1), d + (size_t)i0 * s.ldo, s.ldo, v, s.ldkv,
                  F(0), ds.data(), nk);
          for (int i = i0; i < i1; i++) {
            F* prow = p.data() + (size_t)(i - i0) * nk;
            F* drow = ds.data() + (size_t)(i - i0) * nk;
            const int first = std::min(first_key(s, b, i), nk), last = s.diagonal ? i : T - 1;
            for (int j = first; j <= last; j++) {
              prow[j] = std::exp(prow[j] - row_lse[i]);
              drow[j] = prow[j] * (drow[j] - row_delta[i]);
            }
            std::fill(prow, prow + first, F(0));
            std::fill(drow, drow + first, F(0));
            std::fill(prow + std::max(first, last + 1), prow + nk, F(0));
            std::fill(drow + std::max(first, last + 1), drow + nk, F(0));
          }
          gemm<F>(false, false, i1 - i0, hs, nk, scale, ds.data(), nk, k, s.ldkv, F(1),
                  dqh + (size_t)i0 * s.ldq, s.ldq);
          gemm<F>(true, false, nk, hs, i1 - i0, scale, ds.data(), nk, qh + (size_t)i0 * s.ldq,
                  s.ldq, F(1), dk, s.ldkv);
          gemm<F>(true, false, nk, hs, i1 - i0, F(1), p.data(), nk, d + (size_t)i0 * s.ldo, s.ldo,
                  F(1), dv, s.ldkv);
        }
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_block_forward<F>(F*, F*, const F*, const F*, const AttentionBlock&);     \
  template void attention_delta<F>(F*, const F*, const F*, int, int, int, int, int);               \
  template void attention_block_backward<F>(F*, F*, const F*, const F*, const F*, const F*,        \
                                            const F*, const AttentionBlock&);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
