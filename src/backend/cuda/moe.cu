// Mixture of experts (model.moe): the router's scores, choice and gates and their backward, and
// the rows moved between token order and expert order; twin of moe.cpp, the rule
// backend/moe_routing.hpp's. The router's arithmetic is fp32 whatever the activations' type (its
// logits may be bf16; scores, gates and their gradients are fp32). Every sum has a fixed order:
// the same bits each run and on every GPU.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// One token's scores from its logits: softmax (max subtracted) or sigmoid; expf, not __expf, as
// the other kernels (the CPU parity).
template <typename F>
__device__ void scores_of(float* s, const F* l, int E, bool sigmoid) {
  if (sigmoid) {
    for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-to_float(l[e])));
    return;
  }
  float m = to_float(l[0]);
  for (int e = 1; e < E; e++) m = fmaxf(m, to_float(l[e]));
  float sum = 0;
  for (int e = 0; e < E; e++) sum += (s[e] = expf(to_float(l[e]) - m));
  for (int e = 0; e < E; e++) s[e] /= sum;
}

template <typename F>
__device__ float logsumexp(const F* l, int E) {
  float m = to_float(l[0]);
  for (int e = 1; e < E; e++) m = fmaxf(m, to_float(l[e]));
  float sum = 0;
  for (int e = 0; e < E; e++) sum += expf(to_float(l[e]) - m);
  return m + logf(sum);
}

// One thread a token: its scores, its k choices (k passes of a max over the experts not yet
// chosen; the first of equal keys wins), its gates.
template <typename F>
__global__ void moe_route_forward_kernel(int32_t* expert, float* gates, float* scores,
                                         const F* logits, const float* bias, int N,
                                         MoeRouting r) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int E = r.experts, k = r.top_k;
  float* s = scores + size_t(t) * E;
  scores_of(s, logits + size_t(t) * E, E, r.sigmoid);
  int32_t* chosen = expert + size_t(t) * k;
  for (int j = 0; j < k; j++) {
    int best = -1;
    float best_key = 0;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken = taken || chosen[i] == e;
      if (taken) continue;
      const float key = s[e] + (bias ? bias[e] : 0.0f);
      if (best < 0 || key > best_key) best = e, best_key = key;
    }
    chosen[j] = best;
  }
  float* g = gates + size_t(t) * k;
  float sum = 0;
  for (int j = 0; j < k; j++) sum += (g[j] = s[chosen[j]]);
  if (r.renormalize)
    for (int j = 0; j < k; j++) g[j] /= sum;
}

// The score gradient of expert e of one token (backend/cpu/moe.cpp states it): the gates' part
// (through the renormalisation) and the auxiliary loss's (through p = s / Σ s for sigmoid).
struct ScoreGrad {
  const float *s, *dg, *aux;
  const int32_t* chosen;
  int E, k;
  bool renormalize, sigmoid;
  float S_chosen, dot_chosen, S_all, dot_aux;
  __device__ float operator()(int e) const {
    float ds = 0;
    for (int j = 0; j < k; j++)
      if (chosen[j] == e) ds += renormalize ? (dg[j] - dot_chosen) / S_chosen : dg[j];
    if (aux) ds += sigmoid ? (aux[e] - dot_aux) / S_all : aux[e];
    return ds;
  }
};

template <typename F>
__global__ void moe_route_backward_kernel(F* dlogits, const float* dgates, const F* logits,
                                          const float* scores, const int32_t* expert,
                                          const float* aux, float z_scale, int N, MoeRouting r) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int E = r.experts, k = r.top_k;
  ScoreGrad g{scores + size_t(t) * E, dgates + size_t(t) * k, aux, expert + size_t(t) * k,
              E, k, r.renormalize, r.sigmoid, 0, 0, 0, 0};
  for (int j = 0; j < k; j++) g.S_chosen += g.s[g.chosen[j]];
  for (int j = 0; j < k; j++) g.dot_chosen += g.dg[j] * (g.s[g.chosen[j]] / g.S_chosen);
  if (aux && r.sigmoid) {
    for (int e = 0; e < E; e++) g.S_all += g.s[e];
    for (int e = 0; e < E; e++) g.dot_aux += aux[e] * (g.s[e] / g.S_all);
  }
  float dot = 0;
  if (!r.sigmoid)
    for (int e = 0; e < E; e++) dot += g.s[e] * g(e);
  const F* l = logits + size_t(t) * E;
  const float lse = z_scale != 0 ? logsumexp(l, E) : 0.0f;
  F* dl = dlogits + size_t(t) * E;
  for (int e = 0; e < E; e++) {
    const float s = g.s[e];
    float d = r.sigmoid ? g(e) * s * (1.0f - s) : s * (g(e) - dot);
    if (z_scale != 0) d += z_scale * lse * expf(to_float(l[e]) - lse);
    dl[e] = from_float<F>(d);
  }
}

// One thread an expert (and one more for the z-loss's sum), in token order: fixed sums.
template <typename F>
__global__ void moe_router_stats_kernel(double* stats, const F* logits, const float* scores,
                                        int N, MoeRouting r) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x, E = r.experts;
  if (e > E) return;
  double sum = 0;
  for (int t = 0; t < N; t++) {
    if (e == E) {
      const double lse = logsumexp(logits + size_t(t) * E, E);
      sum += lse * lse;
      continue;
    }
    const float* s = scores + size_t(t) * E;
    double S = 1;
    if (r.sigmoid) {
      S = 0;
      for (int i = 0; i < E; i++) S += s[i];
    }
    sum += double(s[e]) / S;
  }
  stats[e] = sum;
}

template <typename F>
__global__ void moe_gather_rows_kernel(F* out, const F* in, const int32_t* rows, int n, int C) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * C) return;
  out[i] = in[size_t(rows[i / C]) * C + i % C];
}

template <typename F>
__global__ void moe_combine_kernel(F* out, const F* rows, const int32_t* slot_of,
                                   const float* gates, int N, int k, int C, bool accumulate) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * C) return;
  const size_t t = i / C, c = i % C;
  float o = accumulate ? to_float(out[i]) : 0.0f;
  for (int j = 0; j < k; j++) {
    const int32_t slot = slot_of[t * k + j];
    if (slot < 0) continue;  // dropped by the capacity
    o += (gates ? gates[t * k + j] : 1.0f) * to_float(rows[size_t(slot) * C + c]);
  }
  out[i] = from_float<F>(o);
}

// One warp a (token, choice): the row's gradient, and the gate's as a warp sum in lane order.
template <typename F>
__global__ void moe_combine_backward_kernel(F* drows, float* dgates, const F* dout, const F* rows,
                                            const int32_t* slot_of, const float* gates, int N,
                                            int k, int C) {
  const size_t tj = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (tj >= size_t(N) * k) return;
  const int32_t slot = slot_of[tj];
  if (slot < 0) {
    if (lane == 0) dgates[tj] = 0;
    return;
  }
  const F* d = dout + tj / k * C;
  const F* y = rows + size_t(slot) * C;
  F* dy = drows + size_t(slot) * C;
  const float g = gates[tj];
  float dot = 0;
  for (int c = lane; c < C; c += kWarp) {
    dot += to_float(d[c]) * to_float(y[c]);
    dy[c] = from_float<F>(g * to_float(d[c]));
  }
  dot = warp_sum(dot);
  if (lane == 0) dgates[tj] = dot;
}

}  // namespace

template <typename F>
void moe_route_forward(int32_t* expert, float* gates, float* scores, const F* logits,
                       const float* bias, int N, const MoeRouting& r) {
  if (N <= 0) return;
  launch<moe_route_forward_kernel<F>>(blocks_for(size_t(N), kThreads), kThreads, 0, stream(),
                                      expert, gates, scores, logits, bias, N, r);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void moe_route_backward(F* dlogits, const float* dgates, const F* logits, const float* scores,
                        const int32_t* expert, const float* aux, double z_coef, int N,
                        const MoeRouting& r) {
  if (N <= 0) return;
  const float z_scale = float(2 * z_coef / N);
  launch<moe_route_backward_kernel<F>>(blocks_for(size_t(N), kThreads), kThreads, 0, stream(),
                                       dlogits, dgates, logits, scores, expert, aux, z_scale, N,
                                       r);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void moe_router_stats(double* stats, const F* logits, const float* scores, int N,
                      const MoeRouting& r) {
  launch<moe_router_stats_kernel<F>>(blocks_for(size_t(r.experts) + 1, kThreads), kThreads, 0,
                                     stream(), stats, logits, scores, N, r);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void moe_gather_rows(F* out, const F* in, const int32_t* rows, int n, int C) {
  if (n <= 0 || C <= 0) return;
  launch<moe_gather_rows_kernel<F>>(blocks_for(size_t(n) * C, kThreads), kThreads, 0, stream(),
                                    out, in, rows, n, C);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void moe_combine(F* out, const F* rows, const int32_t* slot_of, const float* gates, int N, int k,
                 int C, bool accumulate) {
  if (N <= 0 || C <= 0) return;
  launch<moe_combine_kernel<F>>(blocks_for(size_t(N) * C, kThreads), kThreads, 0, stream(), out,
                                rows, slot_of, gates, N, k, C, accumulate);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void moe_combine_backward(F* drows, float* dgates, const F* dout, const F* rows,
                          const int32_t* slot_of, const float* gates, int N, int k, int C) {
  if (N <= 0) return;
  launch<moe_combine_backward_kernel<F>>(blocks_for(size_t(N) * k * kWarp, kThreads), kThreads,
                                         0, stream(), drows, dgates, dout, rows, slot_of, gates,
                                         N, k, C);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void moe_route_forward<F>(int32_t*, float*, float*, const F*, const float*, int,       \
                                     const MoeRouting&);                                          \
  template void moe_route_backward<F>(F*, const float*, const F*, const float*, const int32_t*,   \
                                      const float*, double, int, const MoeRouting&);              \
  template void moe_router_stats<F>(double*, const F*, const float*, int, const MoeRouting&);     \
  template void moe_gather_rows<F>(F*, const F*, const int32_t*, int, int);                       \
  template void moe_combine<F>(F*, const F*, const int32_t*, const float*, int, int, int, bool);  \
  template void moe_combine_backward<F>(F*, float*, const F*, const F*, const int32_t*,           \
                                        const float*, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
