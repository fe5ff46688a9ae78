// Softmax cross-entropy over a vocabulary that may be split between tensor-parallel ranks.
// The forward is three passes with a reduction between them (max, then sum-exp and the target
// logit), so full logits never exist on one rank: with one rank the reductions are no-ops.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// logits (N,Vl): vocabulary ids [v0, v0 + Vl), the first `valid` columns real. row_max (N)
// overwritten with the max of the real columns (lowest() when this rank has none).
template <typename F>
void crossentropy_row_max(F* row_max, const F* logits, int N, int Vl, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* x = logits + (size_t)n * Vl;
    F mx = std::numeric_limits<F>::lowest();
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < valid; v++) mx = std::max(mx, x[v]);
    row_max[n] = mx;
  }
}

// row_max (N): the max over the whole vocabulary. probs (N,Vl) = exp(logit - max) on the real
// columns, 0 on the padding (may alias logits: the target logit is read first). sums (N,2):
// [sum of exp over this rank's columns, target logit - max if the target is here, else 0].
template <typename F>
void crossentropy_exp_sums(double* sums, F* probs, const F* logits, const F* row_max,
                           const int32_t* targets, int N, int Vl, int valid, int v0) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* x = logits + (size_t)n * Vl;
    F* p = probs + (size_t)n * Vl;
    const F mx = row_max[n];
    const int t = targets[n] - v0;
    sums[2 * n + 1] = t >= 0 && t < valid ? double(x[t] - mx) : 0.0;
    double sum = 0.0;  // up to ~10^5 terms: a float sum would lose the small ones
    for (int v = 0; v < valid; v++) {
      const F e = std::exp(x[v] - mx);
      p[v] = e;
      sum += e;
    }
    std::fill(p + valid, p + Vl, F(0));
    sums[2 * n] = sum;
  }
}

// sums (N,2) reduced over the vocabulary. probs (N,Vl) normalised in place; losses (N) =
// log(sum) - (target logit - max), exact even where the target's probability underflows to 0.
template <typename F>
void crossentropy_finish(F* losses, F* probs, const double* sums, int N, int Vl, int valid) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    F* p = probs + (size_t)n * Vl;
    const F inv = F(1.0 / sums[2 * n]);
    for (int v = 0; v < valid; v++) p[v] *= inv;
    losses[n] = F(std::log(sums[2 * n]) - sums[2 * n + 1]);
  }
}

// probs (N,Vl) from the forward, targets (N). dlogits (N,Vl) overwritten:
// dloss * (probs - onehot(target)) on the real columns, 0 on the padding. May alias probs.
template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N,
                           int Vl, int valid, int v0) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* p = probs + (size_t)n * Vl;
    F* d = dlogits + (size_t)n * Vl;
    const int t = targets[n] - v0;
    const F pt = t >= 0 && t < valid ? p[t] : F(0);  // read before an aliased row is overwritten
    for (int v = 0; v < valid; v++) d[v] = dloss * p[v];
    if (t >= 0 && t < valid) d[t] = dloss * (pt - F(1));
    std::fill(d + valid, d + Vl, F(0));
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void crossentropy_row_max<F>(F*, const F*, int, int, int);                             \
  template void crossentropy_exp_sums<F>(double*, F*, const F*, const F*, const int32_t*, int,    \
                                         int, int, int);                                          \
  template void crossentropy_finish<F>(F*, F*, const double*, int, int, int);                     \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, F, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
