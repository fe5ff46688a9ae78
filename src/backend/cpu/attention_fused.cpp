// Causal multi-head self-attention that keeps no T x T matrix (model.attention: fused): the
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

// qkv (B,T,3C) as attention_forward. out (B,T,C) = softmax(q·kᵀ/sqrt(hs), causal)·v;
// lse (B,NH,T) = log Σ_{j<=i} exp(q_i·k_j/sqrt(hs)). Overwrites out and lse.
template <typename F>
void attention_fused_forward(F* out, F* lse, const F* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const F* q = qkv + (size_t)b * T * C3 + h * hs;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* o = out + (size_t)b * T * C + h * hs;
      F* row_lse = lse + ((size_t)b * NH + h) * T;
      std::vector<F> p((size_t)std::min(T, kRowBlock) * T);
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        // p[0:i1-i0, 0:i1] = scale * q[i0:i1] · k[0:i1]ᵀ, then each row's causal softmax
        gemm<F>(false, true, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, F(0),
                p.data(), i1);
        for (int i = i0; i < i1; i++) {
          F* row = p.data() + (size_t)(i - i0) * i1;
          F mx = row[0];
          for (int j = 1; j <= i; j++) mx = std::max(mx, row[j]);
          double sum = 0.0;
          for (int j = 0; j <= i; j++) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const F inv = F(1.0 / sum);
          for (int j = 0; j <= i; j++) row[j] *= inv;
          std::fill(row + i + 1, row + i1, F(0));
          row_lse[i] = F(mx + std::log(sum));
        }
        gemm<F>(false, false, i1 - i0, hs, i1, F(1), p.data(), i1, v, C3, F(0),
                o + (size_t)i0 * C, C);
      }
    }
  }
}

// Accumulates dqkv (B,T,3C) from dout (B,T,C), with out (B,T,C) and lse (B,NH,T) of the forward:
// P = exp(scores - lse), dP = dout·vᵀ, dscores = P ∘ (dP - rowsum(dout ∘ out)).
template <typename F>
void attention_fused_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                              int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const F scale = F(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t qoff = (size_t)b * T * C3 + h * hs;
      const size_t ooff = (size_t)b * T * C + h * hs;
      const F* q = qkv + qoff;
      const F* k = q + C;
      const F* v = q + 2 * C;
      F* dq = dqkv + qoff;
      F* dk = dq + C;
      F* dv = dq + 2 * C;
      const F* d = dout + ooff;
      const F* o = out + ooff;
      const F* row_lse = lse + ((size_t)b * NH + h) * T;
      const size_t block = (size_t)std::min(T, kRowBlock) * T;
      std::vector<F> p(block), ds(block);
      for (int i0 = 0; i0 < T; i0 += kRowBlock) {
        const int i1 = std::min(T, i0 + kRowBlock);
        gemm<F>(false, true, i1 - i0, i1, hs, scale, q + (size_t)i0 * C3, C3, k, C3, F(0),
                p.data(), i1);
        gemm<F>(false, true, i1 - i0, i1, hs, F(1), d + (size_t)i0 * C, C, v, C3, F(0),
                ds.data(), i1);
        for (int i = i0; i < i1; i++) {
          F* prow = p.data() + (size_t)(i - i0) * i1;
          F* drow = ds.data() + (size_t)(i - i0) * i1;
          double dot = 0.0;
          for (int c = 0; c < hs; c++) dot += (double)d[(size_t)i * C + c] * o[(size_t)i * C + c];
          const F dotf = F(dot);
          for (int j = 0; j <= i; j++) {
            prow[j] = std::exp(prow[j] - row_lse[i]);
            drow[j] = prow[j] * (drow[j] - dotf);
          }
          std::fill(prow + i + 1, prow + i1, F(0));
          std::fill(drow + i + 1, drow + i1, F(0));
        }
        // dq[i0:i1] += scale * ds · k[0:i1]; dk[0:i1] += scale * dsᵀ · q[i0:i1];
        // dv[0:i1] += pᵀ · dout[i0:i1]
        gemm<F>(false, false, i1 - i0, hs, i1, scale, ds.data(), i1, k, C3, F(1),
                dq + (size_t)i0 * C3, C3);
        gemm<F>(true, false, i1, hs, i1 - i0, scale, ds.data(), i1, q + (size_t)i0 * C3, C3,
                F(1), dk, C3);
        gemm<F>(true, false, i1, hs, i1 - i0, F(1), p.data(), i1, d + (size_t)i0 * C, C, F(1),
                dv, C3);
      }
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void attention_fused_forward<F>(F*, F*, const F*, int, int, int, int);                 \
  template void attention_fused_backward<F>(F*, const F*, const F*, const F*, const F*, int, int,  \
                                            int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
