// Mixture of experts (model.moe): the router's scores, choice and gates and their backward, and
// the rows moved between token order and expert order; twin of moe.cu. The rule is
// backend/moe_routing.hpp's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

namespace {

// s (E) from one row of logits: softmax (max subtracted), or sigmoid.
template <typename F>
void scores_of(F* s, const F* l, int E, bool sigmoid) {
  if (sigmoid) {
    for (int e = 0; e < E; e++) s[e] = F(1) / (F(1) + std::exp(-l[e]));
    return;
  }
  F m = l[0];
  for (int e = 1; e < E; e++) m = std::max(m, l[e]);
  F sum = 0;
  for (int e = 0; e < E; e++) sum += (s[e] = std::exp(l[e] - m));
  for (int e = 0; e < E; e++) s[e] /= sum;
}

// log Σ exp(l) over one row.
template <typename F>
F logsumexp(const F* l, int E) {
  F m = l[0];
  for (int e = 1; e < E; e++) m = std::max(m, l[e]);
  F sum = 0;
  for (int e = 0; e < E; e++) sum += std::exp(l[e] - m);
  return m + std::log(sum);
}

}  // namespace

template <typename F>
void moe_route_forward(int32_t* expert, F* gates, F* scores, const F* logits, const float* bias,
                       int N, const MoeRouting& r) {
  const int E = r.experts, k = r.top_k;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; t++) {
    F* s = scores + size_t(t) * E;
    scores_of(s, logits + size_t(t) * E, E, r.sigmoid);
    int32_t* chosen = expert + size_t(t) * k;
    // k passes of a max over the experts not yet chosen: the first of equal keys wins.
    for (int j = 0; j < k; j++) {
      int best = -1;
      F best_key = 0;
      for (int e = 0; e < E; e++) {
        if (std::find(chosen, chosen + j, e) != chosen + j) continue;
        const F key = s[e] + (bias ? F(bias[e]) : F(0));
        if (best < 0 || key > best_key) best = e, best_key = key;
      }
      chosen[j] = best;
    }
    F* g = gates + size_t(t) * k;
    F sum = 0;
    for (int j = 0; j < k; j++) sum += (g[j] = s[chosen[j]]);
    if (r.renormalize)
      for (int j = 0; j < k; j++) g[j] /= sum;
  }
}

template <typename F>
void moe_route_backward(F* dlogits, const F* dgates, const F* logits, const F* scores,
                        const int32_t* expert, const F* aux, double z_coef, int N,
                        const MoeRouting& r) {
  const int E = r.experts, k = r.top_k;
#pragma omp parallel
  {
    std::vector<F> ds(size_t(E), F(0));
#pragma omp for schedule(static)
    for (int t = 0; t < N; t++) {
      const F* s = scores + size_t(t) * E;
      const int32_t* chosen = expert + size_t(t) * k;
      const F* dg = dgates + size_t(t) * k;
      std::fill(ds.begin(), ds.end(), F(0));
      // The gates: g_j = s_{e_j} (/ S, S = Σ_j s_{e_j}, when renormalised).
      if (r.renormalize) {
        F S = 0, dot = 0;
        for (int j = 0; j < k; j++) S += s[chosen[j]];
        for (int j = 0; j < k; j++) dot += dg[j] * (s[chosen[j]] / S);
        for (int j = 0; j < k; j++) ds[size_t(chosen[j])] += (dg[j] - dot) / S;
      } else {
        for (int j = 0; j < k; j++) ds[size_t(chosen[j])] += dg[j];
      }
      // The auxiliary loss: dL/dp[t,e] = aux[e], through p = s / Σ s for sigmoid scores.
      if (aux) {
        if (r.sigmoid) {
          F S = 0, dot = 0;
          for (int e = 0; e < E; e++) S += s[e];
          for (int e = 0; e < E; e++) dot += aux[e] * (s[e] / S);
          for (int e = 0; e < E; e++) ds[size_t(e)] += (aux[e] - dot) / S;
        } else {
          for (int e = 0; e < E; e++) ds[size_t(e)] += aux[e];
        }
      }
      F* dl = dlogits + size_t(t) * E;
      if (r.sigmoid) {
        for (int e = 0; e < E; e++) dl[e] = ds[size_t(e)] * s[e] * (F(1) - s[e]);
      } else {
        F dot = 0;
        for (int e = 0; e < E; e++) dot += s[e] * ds[size_t(e)];
        for (int e = 0; e < E; e++) dl[e] = s[e] * (ds[size_t(e)] - dot);
      }
      // The z-loss: d/dl (z_coef / N · lse²) = z_coef / N · 2 lse · softmax(l).
      if (z_coef != 0) {
        const F* l = logits + size_t(t) * E;
        const F lse = logsumexp(l, E), c = F(2 * z_coef / N) * lse;
        for (int e = 0; e < E; e++) dl[e] += c * std::exp(l[e] - lse);
      }
    }
  }
}

template <typename F>
void moe_router_stats(double* stats, const F* logits, const F* scores, int N,
                      const MoeRouting& r) {
  const int E = r.experts;
  std::fill(stats, stats + E + 1, 0.0);
  // In token order on one thread: the sums are the same whatever the thread count.
  for (int t = 0; t < N; t++) {
    const F* s = scores + size_t(t) * E;
    double S = 1;
    if (r.sigmoid) {
      S = 0;
      for (int e = 0; e < E; e++) S += double(s[e]);
    }
    for (int e = 0; e < E; e++) stats[e] += double(s[e]) / S;
    const double lse = double(logsumexp(logits + size_t(t) * E, E));
    stats[E] += lse * lse;
  }
}

template <typename F>
void moe_gather_rows(F* out, const F* in, const int32_t* rows, int n, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++)
    std::memcpy(out + size_t(i) * C, in + size_t(rows[i]) * C, size_t(C) * sizeof(F));
}

template <typename F>
void moe_combine(F* out, const F* rows, const int32_t* slot_of, const F* gates, int N, int k,
                 int C, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; t++) {
    F* o = out + size_t(t) * C;
    if (!accumulate) std::fill(o, o + C, F(0));
    for (int j = 0; j < k; j++) {
      const int32_t slot = slot_of[size_t(t) * k + j];
      if (slot < 0) continue;  // dropped by the capacity
      const F g = gates ? gates[size_t(t) * k + j] : F(1);
      const F* y = rows + size_t(slot) * C;
      for (int c = 0; c < C; c++) o[c] += g * y[c];
    }
  }
}

template <typename F>
void moe_combine_backward(F* drows, F* dgates, const F* dout, const F* rows,
                          const int32_t* slot_of, const F* gates, int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; t++) {
    const F* d = dout + size_t(t) * C;
    for (int j = 0; j < k; j++) {
      const size_t tj = size_t(t) * k + j;
      const int32_t slot = slot_of[tj];
      if (slot < 0) {
        dgates[tj] = 0;
        continue;
      }
      const F g = gates[tj];
      const F* y = rows + size_t(slot) * C;
      F* dy = drows + size_t(slot) * C;
      F dot = 0;
      for (int c = 0; c < C; c++) {
        dot += d[c] * y[c];
        dy[c] = g * d[c];
      }
      dgates[tj] = dot;
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void moe_route_forward<F>(int32_t*, F*, F*, const F*, const float*, int,               \
                                     const MoeRouting&);                                          \
  template void moe_route_backward<F>(F*, const F*, const F*, const F*, const int32_t*, const F*, \
                                      double, int, const MoeRouting&);                            \
  template void moe_router_stats<F>(double*, const F*, const F*, int, const MoeRouting&);         \
  template void moe_gather_rows<F>(F*, const F*, const int32_t*, int, int);                       \
  template void moe_combine<F>(F*, const F*, const int32_t*, const F*, int, int, int, bool);      \
  template void moe_combine_backward<F>(F*, F*, const F*, const F*, const int32_t*, const F*,     \
                                        int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
