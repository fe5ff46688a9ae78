// Linear layer (torch nn.Linear layout): forward and backward through gemm.
#include <algorithm>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// Column sums walk the rows in order inside a block of columns: unit-stride reads, no race, and
// the same summation order whatever the thread count.
static constexpr int kColBlock = 64;

// out (N,OC) = inp (N,IC) · weightᵀ (IC,OC) + bias (OC); weight (OC,IC); bias may be nullptr.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC) {
  F beta = F(0);
  if (bias) {  // preload the bias so the product adds onto it in the same pass (beta = 1)
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::copy(bias, bias + OC, out + (size_t)n * OC);
    beta = F(1);
  }
  gemm<F>(false, true, N, OC, IC, F(1), inp, IC, weight, IC, beta, out, OC);
}

// out (N,OC) += bias (OC): the bias of a row-parallel layer, added once after the partial
// products of the tensor-parallel ranks are summed.
template <typename F>
void bias_add(F* out, const F* bias, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    F* o = out + (size_t)n * OC;
#pragma omp simd
    for (int c = 0; c < OC; c++) o[c] += bias[c];
  }
}

// dout (N,OC), inp (N,IC), weight (OC,IC). Accumulates dinp (N,IC), dweight (OC,IC), dbias (OC);
// dinp and dbias may be nullptr (the first layer's input needs no gradient; c_proj bias may be
// handled elsewhere under tensor parallelism).
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int IC, int OC) {
  if (dinp) gemm<F>(false, false, N, IC, OC, F(1), dout, OC, weight, IC, F(1), dinp, IC);
  gemm<F>(true, false, OC, IC, N, F(1), dout, OC, inp, IC, F(1), dweight, IC);
  if (!dbias) return;
  const int nblocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int o0 = blk * kColBlock, o1 = std::min(OC, o0 + kColBlock);
    F sum[kColBlock] = {};  // sum first, then add once: accumulating a micro-batch loses less
    for (int n = 0; n < N; n++) {
      const F* row = dout + (size_t)n * OC;
      for (int o = o0; o < o1; o++) sum[o - o0] += row[o];
    }
    for (int o = o0; o < o1; o++) dbias[o] += sum[o - o0];
  }
}

// Each of `held` experts' linear layer on its block of rows: expert e's rows start at
// offsets[e], counts[e] of them (host arrays), its weight (OC,IC) at weight + e OC IC, its bias at
// bias + e OC. The CPU calls one GEMM per expert (the CUDA backend may group them).
template <typename F>
void experts_forward(F* out, const F* inp, const F* weight, const F* bias, const int* counts,
                     const int* offsets, int held, int IC, int OC) {
  for (int e = 0; e < held; e++) {
    if (counts[e] == 0) continue;
    const size_t r0 = size_t(offsets[e]);
    matmul_forward(out + r0 * OC, inp + r0 * IC, weight + size_t(e) * OC * IC,
                   bias ? bias + size_t(e) * OC : nullptr, counts[e], IC, OC);
  }
}

template <typename F>
void experts_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                      const int* counts, const int* offsets, int held, int IC, int OC) {
  for (int e = 0; e < held; e++) {
    if (counts[e] == 0) continue;
    const size_t r0 = size_t(offsets[e]);
    matmul_backward(dinp ? dinp + r0 * IC : nullptr, dweight + size_t(e) * OC * IC,
                    dbias ? dbias + size_t(e) * OC : nullptr, dout + r0 * OC, inp + r0 * IC,
                    weight + size_t(e) * OC * IC, counts[e], IC, OC);
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void experts_forward<F>(F*, const F*, const F*, const F*, const int*, const int*, int, \
                                   int, int);                                                     \
  template void experts_backward<F>(F*, F*, F*, const F*, const F*, const F*, const int*,         \
                                    const int*, int, int, int);                                   \
  template void bias_add<F>(F*, const F*, int, int);                                             \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int, int, int);               \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
