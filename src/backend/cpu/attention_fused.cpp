// Causal grouped-query self-attention that keeps no T x T matrix (model.attention: fused): the
// forward saves each query row's log-sum-exp of its scaled scores, and the backward recomputes
// the probabilities from it, one block of query rows at a time. Twin of attention_fused.cu.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// Query rows per block: a block's scores (kRowBlock x i1) are the only T-long temporaries, and
// each product stays large enough for BLAS.
static constexpr int kRowBlock = 64;

// qkv (B,T,(NH+2*NKV)*hs) as attention_forward. out (B,T,NH*hs) = softmax(q·kᵀ/sqrt(hs),
// causal)·v; lse (B,NH,T) = log Σ_{s<=j<=i} exp(q_i·k_j/sqrt(hs)), s the query's document start
// (doc_start, else 0). Overwrites out and lse.
template <typename F>
void attention_fused_forward(F* out, F* lse, const F* qkv, int B, int T, int NH, int NKV, int hs,
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
      F* o = out + (size_t)b * T * Cq + (size_t)h * hs;
      F* row_lse = lse + ((size_t)b * NH + h) * T;
      std::vector<F> p((size_t)std::min(T, kRowBlock) * T);
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        // p[0:i1-i0, 0:i1] = scale * q[i0:i1] · k[0:i1]ᵀ, then each row's causal softmax
        gemm<F>(false, true, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, F(0),
                p.data(), i1);
        for (int i = i0; i < i1; i++) {
          F* prow = p.data() + (size_t)(i - i0) * i1;
          const int s0 = doc_start ? doc_start[(size_t)b * T + i] : 0;
          F mx = prow[s0];
          for (int j = s0 + 1; j <= i; j++) mx = std::max(mx, prow[j]);
          double sum = 0.0;
          for (int j = s0; j <= i; j++) {
            prow[j] = std::exp(prow[j] - mx);
            sum += prow[j];
          }
          const F inv = F(1.0 / sum);
          for (int j = s0; j <= i; j++) prow[j] *= inv;
          std::fill(prow, prow + s0, F(0));
          std::fill(prow + i + 1, prow + i1, F(0));
          row_lse[i] = F(mx + std::log(sum));
        }
        gemm<F>(false, false, i1 - i0, hs, i1, F(1), p.data(), i1, v, C3, F(0),
                o + (size_t)i0 * Cq, Cq);
      }
    }
  }
}

// Accumulates dqkv from dout (B,T,NH*hs), with out (B,T,NH*hs) and lse (B,NH,T) of the forward:
// P = exp(scores - lse), dP = dout·vᵀ, dscores = P ∘ (dP - rowsum(dout ∘ out)).
// One (b, kv head) per task: it walks the kv head's query heads in order, so its dk and dv have
// one writer and a fixed order of additions, and each query head's dq is written by one task.
template <typename F>
void attention_fused_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                              int B, int T, int NH, int NKV, int hs, const int32_t* doc_start) {
  const int G = NH / NKV, C3 = (NH + 2 * NKV) * hs, Cq = NH * hs;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int g = 0; g < NKV; g++) {
      const size_t koff = (size_t)b * T * C3 + (size_t)(NH + g) * hs;
      const F* k = qkv + koff;
      const F* v = k + (size_t)NKV * hs;
      F* dk = dqkv + koff;
      F* dv = dk + (size_t)NKV * hs;
      const size_t block = (size_t)std::min(T, kRowBlock) * T;
      std::vector<F> p(block), ds(block);
      for (int h = g * G; h < (g + 1) * G; h++) {
        const size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
        const size_t ooff = (size_t)b * T * Cq + (size_t)h * hs;
        const F* q = qkv + qoff;
        F* dq = dqkv + qoff;
        const F* d = dout + ooff;
        const F* o = out + ooff;
        const F* row_lse = lse + ((size_t)b * NH + h) * T;
        for (int i0 = 0; i0 < T; i0 += kRowBlock) {
          const int i1 = std::min(T, i0 + kRowBlock);
          gemm<F>(false, true, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, F(0),
                  p.data(), i1);
          gemm<F>(false, true, i1 - i0, i1, hs, F(1), d + (size_t)i0 * Cq, Cq, v, C3, F(0),
                  ds.data(), i1);
          for (int i = i0; i < i1; i++) {
            F* prow = p.data() + (size_t)(i - i0) * i1;
            F* drow = ds.data() + (size_t)(i - i0) * i1;
            double dot = 0.0;
            for (int c = 0; c < hs; c++)
              dot += (double)d[(size_t)i * Cq + c] * o[(size_t)i * Cq + c];
            const F dotf = F(dot);
            const int s0 = doc_start ? doc_start[(size_t)b * T + i] : 0;
            for (int j = s0; j <= i; j++) {
              prow[j] = std::exp(prow[j] - row_lse[i]);
              drow[j] = prow[j] * (drow[j] - dotf);
            }
            std::fill(prow, prow + s0, F(0));
            std::fill(drow, drow + s0, F(0));
            std::fill(prow + i + 1, prow + i1, F(0));
            std::fill(drow + i + 1, drow + i1, F(0));
          }
          // dq[i0:i1] += scale * ds · k[0:i1]; dk[0:i1] += scale * dsᵀ · q[i0:i1];
          // dv[0:i1] += pᵀ · dout[i0:i1]
          gemm<F>(false, false, i1 - i0, hs, i1, scale, ds.data(), i1, k, C3, F(1),
                  dq + (size_t)i0 * C3, C3);
          gemm<F>(true, false, i1, hs, i1 - i0, scale, ds.data(), i1, q + (size_t)i0 * C3, C3,
                  F(1), dk, C3);
          gemm<F>(true, false, i1, hs, i1 - i0, F(1), p.data(), i1, d + (size_t)i0 * Cq, Cq,
                  F(1), dv, C3);
        }
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_fused_forward<F>(F*, F*, const F*, int, int, int, int, int,             \
                                           const int32_t*);                                        \
  template void attention_fused_backward<F>(F*, const F*, const F*, const F*, const F*, int, int,  \
                                            int, int, int, const int32_t*);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
