// AdamW and the pieces of global-norm clipping on the device; twin of backend/cpu/adamw.cpp.
#include <cmath>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// One element: the CPU twin's expression, with the same host-computed constants.
struct AdamConstants {
  float b1, b2, bc2_sqrt, step_size, eps, keep;
};
__device__ __forceinline__ void adam_element(float& p, float g, float& m, float& v,
                                             const AdamConstants& k) {
  m = k.b1 * m + (1.0f - k.b1) * g;
  v = k.b2 * v + (1.0f - k.b2) * g * g;
  const float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
  p = p * k.keep - k.step_size * m / denom;
}

// W = 4 fp32 elements (16-byte accesses of p, g, m, v; 8 bytes of a bf16 copy) or 1.
template <typename C, int W>
__global__ void adamw_kernel(float* params, C* params_copy, const float* grads, float* m,
                             float* v, size_t n, AdamConstants k) {
  const size_t packs = n / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    Pack<float, W> p = load_pack<float, W>(params + i * W);
    Pack<float, W> mm = load_pack<float, W>(m + i * W);
    Pack<float, W> vv = load_pack<float, W>(v + i * W);
    const Pack<float, W> g = load_pack<float, W>(grads + i * W);
#pragma unroll
    for (int j = 0; j < W; j++) adam_element(p.v[j], g.v[j], mm.v[j], vv.v[j], k);
    store_pack<float, W>(params + i * W, p);
    store_pack<float, W>(m + i * W, mm);
    store_pack<float, W>(v + i * W, vv);
    if (params_copy) {
      Pack<C, W> h;
#pragma unroll
      for (int j = 0; j < W; j++) h.v[j] = from_float<C>(p.v[j]);
      store_pack<C, W>(params_copy + i * W, h);
    }
  }
  const size_t t = packs * W + i;
  if (t < n) {
    adam_element(params[t], grads[t], m[t], v[t], k);
    if (params_copy) params_copy[t] = from_float<C>(params[t]);
  }
}

// First pass of the sum of squares: block b of a fixed grid of G blocks sums elements b*T + tid,
// then every G*T-th one (T threads), in double; the partial goes to scratch[b]. The grid size
// depends on n alone, so the order of every addition does too.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, size_t n) {
  TESSERA_SHARED(double, shared, [kWarp]);
  double s = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * x[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Second pass: one block adds the G partials (same fixed tree every time) into *acc.
__global__ void sum_partials_kernel(double* acc, const double* partial, int count) {
  TESSERA_SHARED(double, shared, [kWarp]);
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *acc += s;
}

template <int W>
__global__ void scale_kernel(float* x, size_t n, float factor) {
  const size_t packs = n / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    Pack<float, W> p = load_pack<float, W>(x + i * W);
#pragma unroll
    for (int j = 0; j < W; j++) p.v[j] *= factor;
    store_pack<float, W>(x + i * W, p);
  }
  const size_t t = packs * W + i;
  if (t < n) x[t] *= factor;
}

}  // namespace

// One update of n elements of one tensor; `t` is the 1-based Adam step, `decay` whether weight
// decay applies. The constants are computed on the host exactly as the CPU twin does.
template <typename C>
void adamw_update(float* params, C* params_copy, const float* grads, float* m, float* v, size_t n,
                  bool decay, const AdamWHyper& h, double lr, long t) {
  if (n == 0) return;
  AdamConstants k;
  k.b1 = float(h.beta1);
  k.b2 = float(h.beta2);
  const double bc1 = 1.0 - std::pow(h.beta1, double(t));
  k.bc2_sqrt = float(std::sqrt(1.0 - std::pow(h.beta2, double(t))));
  k.step_size = float(lr / bc1);
  k.eps = float(h.eps);
  k.keep = decay ? float(1.0 - lr * h.weight_decay) : 1.0f;
  // The copy's 4-element packs are 4 * sizeof(C) bytes: 8 for bf16, 16 for fp32.
  const uintptr_t copy_align = 4 * sizeof(C) - 1;
  const bool vec = aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v) &&
                   (!params_copy || (reinterpret_cast<uintptr_t>(params_copy) & copy_align) == 0);
  if (vec)
    launch<adamw_kernel<C, 4>>(blocks_for(n / 4, kThreads), kThreads, 0, stream(), params,
                               params_copy, grads, m, v, n, k);
  else
    launch<adamw_kernel<C, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), params,
                               params_copy, grads, m, v, n, k);
  CUDA_CHECK_LAUNCH();
}

void sum_of_squares(double* acc, const float* x, size_t n) {
  if (n == 0) return;
  constexpr int kReduceThreads = 512;
  // Enough blocks to fill the GPU for large n, and at most one scratch slot each.
  const size_t want = (n + kReduceThreads - 1) / kReduceThreads;
  const int grid = int(want < size_t(kScratchDoubles) ? want : size_t(kScratchDoubles));
  double* partial = scratch();
  launch<sum_squares_partial_kernel>(grid, kReduceThreads, 0, stream(), partial, x, n);
  CUDA_CHECK_LAUNCH();
  launch<sum_partials_kernel>(1, kReduceThreads, 0, stream(), acc, partial, grid);
  CUDA_CHECK_LAUNCH();
}

void scale(float* x, size_t n, float factor) {
  if (n == 0) return;
  if (aligned16(x))
    launch<scale_kernel<4>>(blocks_for(n / 4, kThreads), kThreads, 0, stream(), x, n, factor);
  else
    launch<scale_kernel<1>>(blocks_for(n, kThreads), kThreads, 0, stream(), x, n, factor);
  CUDA_CHECK_LAUNCH();
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, size_t, bool,
                                  const AdamWHyper&, double, long);
template void adamw_update<bf16>(float*, bf16*, const float*, float*, float*, size_t, bool,
                                 const AdamWHyper&, double, long);

}  // namespace tessera::cuda
