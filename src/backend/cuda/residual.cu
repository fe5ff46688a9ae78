// Elementwise sums of the residual stream; twin of residual.cpp.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// out = a + b over n elements, packs of W and a scalar tail as in gelu.cu. With a == out this is
// dst += src (aliasing is fine: each element is read and written by one thread).
template <typename D, typename S, int W>
__global__ void add_kernel(D* out, const D* a, const S* b, size_t n) {
  const size_t packs = n / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    const Pack<D, W> x = load_pack<D, W>(a + i * W);
    const Pack<S, W> y = load_pack<S, W>(b + i * W);
    Pack<D, W> z;
#pragma unroll
    for (int k = 0; k < W; k++) z.v[k] = from_float<D>(to_float(x.v[k]) + to_float(y.v[k]));
    store_pack<D, W>(out + i * W, z);
  }
  const size_t tail = packs * W + i;
  if (tail < n) out[tail] = from_float<D>(to_float(a[tail]) + to_float(b[tail]));
}

// W is the pack of the wider type, so each access of D is at most 16 bytes.
template <typename D, typename S>
void add(D* out, const D* a, const S* b, size_t n) {
  if (n == 0) return;
  constexpr int W = kPack<D> < kPack<S> ? kPack<D> : kPack<S>;
  if (aligned16(out) && aligned16(a) && aligned16(b))
    launch<add_kernel<D, S, W>>(blocks_for(n / W, kThreads), kThreads, 0, stream(), out, a, b, n);
  else
    launch<add_kernel<D, S, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// out = a + b, all (n).
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
  add(out, a, b, n);
}

// dst (n) += src (n); the residual stream's backward adds the same gradient into both branches.
template <typename F>
void add_inplace(F* dst, const F* src, size_t n) {
  add(dst, static_cast<const F*>(dst), src, n);
}

// fp32 dst += bf16 src: 4 elements per access (16 bytes of fp32, 8 of bf16).
void add_inplace(float* dst, const bf16* src, size_t n) {
  add(dst, static_cast<const float*>(dst), src, n);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                              \
  template void add_inplace<F>(F*, const F*, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
