// Softmax cross-entropy over a vocabulary that may be split between tensor-parallel ranks; twin of
// crossentropy.cpp, in the same three passes so the reductions between them stay where they are.
#include <cfloat>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

// A vocabulary row (up to ~10^5 columns) per block; threads stride it (adjacent threads read
// adjacent columns, 16 bytes each where the row allows) and a block reduction ends the pass.
constexpr int kThreads = 256;

// The row kernels read a row as packs of W columns (W = 16 bytes when Vl is a multiple of it and
// the pointers are aligned, so every row starts aligned; else 1): thread t takes packs t,
// t + blockDim, ...
template <typename F, int W>
__global__ void row_max_kernel(float* row_max, const F* logits, int Vl, int valid) {
  TESSERA_SHARED(float, shared, [kWarp]);
  const F* x = logits + size_t(blockIdx.x) * Vl;
  float mx = -FLT_MAX;  // lowest(), what the CPU twin gives a rank without real columns
  for (int c = threadIdx.x * W; c < valid; c += blockDim.x * W) {
    const Pack<F, W> p = load_pack<F, W>(x + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k < valid) mx = fmaxf(mx, to_float(p.v[k]));
  }
  mx = block_max(mx, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

// probs row = exp(logit - max) on the real columns, 0 on the padding; sums (N,2) = [Σ exp, target
// logit - max if the target is in this rank's columns else 0]. The exponentials are summed in
// double (a float sum of ~10^5 terms would lose the small ones), per thread then over the block.
template <typename F, int W>
__global__ void exp_sums_kernel(double* sums, F* probs, const F* logits, const float* row_max,
                                const int32_t* targets, int Vl, int valid, int v0) {
  TESSERA_SHARED(double, shared, [kWarp]);
  const int n = blockIdx.x;
  const F* x = logits + size_t(n) * Vl;
  F* p = probs + size_t(n) * Vl;
  const float mx = row_max[n];
  if (threadIdx.x == 0) {
    const int t = targets[n] - v0;
    sums[2 * n + 1] = t >= 0 && t < valid ? double(to_float(x[t]) - mx) : 0.0;
  }
  __syncthreads();  // probs may alias logits: the target logit is read before any is overwritten
  double sum = 0.0;
  for (int c = threadIdx.x * W; c < Vl; c += blockDim.x * W) {
    const Pack<F, W> in = load_pack<F, W>(x + c);
    Pack<F, W> out;
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float e = c + k < valid ? expf(to_float(in.v[k]) - mx) : 0.0f;
      out.v[k] = from_float<F>(e);
      sum += e;
    }
    store_pack<F, W>(p + c, out);
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) sums[2 * n] = sum;
}

// probs row normalised in place (the padding stays 0); losses = log(Σ exp) - (target logit -
// max), exact even where the target's probability underflows to 0.
template <typename F, int W>
__global__ void finish_kernel(float* losses, F* probs, const double* sums, int Vl, int valid) {
  const int n = blockIdx.x;
  F* p = probs + size_t(n) * Vl;
  const float inv = float(1.0 / sums[2 * n]);
  for (int c = threadIdx.x * W; c < valid; c += blockDim.x * W) {
    Pack<F, W> q = load_pack<F, W>(p + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      if (c + k < valid) q.v[k] = from_float<F>(to_float(q.v[k]) * inv);
    store_pack<F, W>(p + c, q);
  }
  if (threadIdx.x == 0) losses[n] = float(log(sums[2 * n]) - sums[2 * n + 1]);
}

// dlogits = dloss * (probs - onehot(target)) on the real columns, 0 on the padding. Elementwise
// (each element read and written by one thread, so dlogits may alias probs), W columns of one row
// per thread: W = 16 bytes when Vl is a multiple of it and both pointers are aligned.
template <typename F, int W>
__global__ void backward_kernel(F* dlogits, const F* probs, const int32_t* targets, float dloss,
                                int N, int Vl, int valid, int v0) {
  const int packs = Vl / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * packs) return;
  const int n = int(i / packs), c = int(i % packs) * W;
  const int t = targets[n] - v0;
  const size_t at = size_t(n) * Vl + c;
  const Pack<F, W> p = load_pack<F, W>(probs + at);
  Pack<F, W> d;
#pragma unroll
  for (int k = 0; k < W; k++) {
    const int v = c + k;
    const float pv = to_float(p.v[k]);
    d.v[k] = from_float<F>(v >= valid ? 0.0f : v == t ? dloss * (pv - 1.0f) : dloss * pv);
  }
  store_pack<F, W>(dlogits + at, d);
}

}  // namespace

// logits (N,Vl): vocabulary ids [v0, v0 + Vl), the first `valid` columns real. row_max (N)
// overwritten with the max of the real columns (-FLT_MAX when this rank has none).
template <typename F>
void crossentropy_row_max(float* row_max, const F* logits, int N, int Vl, int valid) {
  if (N <= 0) return;
  constexpr int W = kPack<F>;
  if (Vl % W == 0 && aligned16(logits))
    launch<row_max_kernel<F, W>>(N, kThreads, 0, stream(), row_max, logits, Vl, valid);
  else
    launch<row_max_kernel<F, 1>>(N, kThreads, 0, stream(), row_max, logits, Vl, valid);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void crossentropy_exp_sums(double* sums, F* probs, const F* logits, const float* row_max,
                           const int32_t* targets, int N, int Vl, int valid, int v0) {
  if (N <= 0) return;
  constexpr int W = kPack<F>;
  if (Vl % W == 0 && aligned16(probs) && aligned16(logits))
    launch<exp_sums_kernel<F, W>>(N, kThreads, 0, stream(), sums, probs, logits, row_max, targets,
                                  Vl, valid, v0);
  else
    launch<exp_sums_kernel<F, 1>>(N, kThreads, 0, stream(), sums, probs, logits, row_max, targets,
                                  Vl, valid, v0);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void crossentropy_finish(float* losses, F* probs, const double* sums, int N, int Vl, int valid) {
  if (N <= 0) return;
  constexpr int W = kPack<F>;
  if (Vl % W == 0 && aligned16(probs))
    launch<finish_kernel<F, W>>(N, kThreads, 0, stream(), losses, probs, sums, Vl, valid);
  else
    launch<finish_kernel<F, 1>>(N, kThreads, 0, stream(), losses, probs, sums, Vl, valid);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, float dloss, int N,
                           int Vl, int valid, int v0) {
  if (N <= 0 || Vl <= 0) return;
  constexpr int W = kPack<F>;
  if (Vl % W == 0 && aligned16(dlogits) && aligned16(probs))
    launch<backward_kernel<F, W>>(blocks_for(size_t(N) * (Vl / W), kThreads), kThreads, 0, stream(),
                                  dlogits, probs, targets, dloss, N, Vl, valid, v0);
  else
    launch<backward_kernel<F, 1>>(blocks_for(size_t(N) * Vl, kThreads), kThreads, 0, stream(),
                                  dlogits, probs, targets, dloss, N, Vl, valid, v0);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void crossentropy_row_max<F>(float*, const F*, int, int, int);                         \
  template void crossentropy_exp_sums<F>(double*, F*, const F*, const float*, const int32_t*, int, \
                                         int, int, int);                                          \
  template void crossentropy_finish<F>(float*, F*, const double*, int, int, int);                 \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, float, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
