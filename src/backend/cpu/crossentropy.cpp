// Softmax cross-entropy over a padded vocabulary.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// logits, probs (N,Vp), first V columns real, the rest padding (Vp is V rounded up for GEMM
// alignment and vocab-parallel sharding); targets (N) in [0,V); losses (N).
// probs = softmax of the first V columns, padding 0; losses = -log probs[target].
// probs may alias logits: each element is read before it is written at the same index, and the
// target logit is read before the row is overwritten.
template <typename F>
void crossentropy_forward(F* losses, F* probs, const F* logits, const int32_t* targets, int N, int V,
                          int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* x = logits + (size_t)n * Vp;
    F* p = probs + (size_t)n * Vp;
    F mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int v = 1; v < V; v++) mx = std::max(mx, x[v]);
    const F target_shifted = x[targets[n]] - mx;
    double sum = 0.0;  // up to ~10^5 terms: a float sum would lose the small ones
    for (int v = 0; v < V; v++) {
      const F e = std::exp(x[v] - mx);
      p[v] = e;
      sum += e;
    }
    const F inv = F(1.0 / sum);
    for (int v = 0; v < V; v++) p[v] *= inv;
    std::fill(p + V, p + Vp, F(0));
    // -log p[target] from the logit itself: exact even where p[target] underflows to 0
    losses[n] = F(std::log(sum) - (double)target_shifted);
  }
}

// probs (N,Vp) from the forward, targets (N). dlogits (N,Vp) overwritten:
// dloss * (probs - onehot(target)) on the first V columns, 0 on the padding. May alias probs.
template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N, int V,
                           int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* p = probs + (size_t)n * Vp;
    F* d = dlogits + (size_t)n * Vp;
    const int t = targets[n];
    const F pt = p[t];  // read before the row is overwritten when dlogits aliases probs
    for (int v = 0; v < V; v++) d[v] = dloss * p[v];
    d[t] = dloss * (pt - F(1));
    std::fill(d + V, d + Vp, F(0));
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void crossentropy_forward<F>(F*, F*, const F*, const int32_t*, int, int, int);         \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, F, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
