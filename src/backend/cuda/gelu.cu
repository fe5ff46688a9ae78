// GELU, tanh approximation, as torch.nn.GELU(approximate='tanh') and GPT-2; twin of gelu.cpp.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubic = 0.044715f;
constexpr int kThreads = 256;

// 0.5 (1 + tanh(u)) is exactly the logistic sigmoid of 2u: one expf, and no cancellation in the
// negative tail as 1 + tanh(u) has. expf overflowing to inf for very negative u gives 0, the
// right limit. expf, not __expf: the fast intrinsic's error would break the 1e-5 parity.
__device__ __forceinline__ float sigmoid_2u(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float gelu(float x) { return x * sigmoid_2u(x); }

// gelu' = 0.5 (1 + tanh u) + 0.5 x sech²(u) u' = sg + 2 x sg (1 - sg) u', sg = sigmoid(2u).
__device__ __forceinline__ float gelu_grad(float x) {
  const float sg = sigmoid_2u(x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return sg + 2.0f * x * sg * (1.0f - sg) * du;
}

// Thread i handles elements [i*W, i*W + W); the n % W elements after the last whole pack go to
// the first threads of the grid, one each.
template <typename F, int W>
__global__ void gelu_forward_kernel(F* out, const F* inp, size_t n) {
  const size_t packs = n / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    const Pack<F, W> x = load_pack<F, W>(inp + i * W);
    Pack<F, W> y;
#pragma unroll
    for (int k = 0; k < W; k++) y.v[k] = from_float<F>(gelu(to_float(x.v[k])));
    store_pack<F, W>(out + i * W, y);
  }
  const size_t tail = packs * W + i;
  if (tail < n) out[tail] = from_float<F>(gelu(to_float(inp[tail])));
}

template <typename F, int W>
__global__ void gelu_backward_kernel(F* dinp, const F* inp, const F* dout, size_t n) {
  const size_t packs = n / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    const Pack<F, W> x = load_pack<F, W>(inp + i * W);
    const Pack<F, W> d = load_pack<F, W>(dout + i * W);
    Pack<F, W> g = load_pack<F, W>(dinp + i * W);
#pragma unroll
    for (int k = 0; k < W; k++)
      g.v[k] = from_float<F>(to_float(g.v[k]) + gelu_grad(to_float(x.v[k])) * to_float(d.v[k]));
    store_pack<F, W>(dinp + i * W, g);
  }
  const size_t tail = packs * W + i;
  if (tail < n)
    dinp[tail] = from_float<F>(to_float(dinp[tail]) + gelu_grad(to_float(inp[tail])) *
                                                          to_float(dout[tail]));
}

}  // namespace

// out, inp (n): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))).
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  if (n == 0) return;
  constexpr int W = kPack<F>;
  if (aligned16(out) && aligned16(inp))
    launch<gelu_forward_kernel<F, W>>(blocks_for(n / W, kThreads), kThreads, 0, stream(), out, inp,
                                      n);
  else
    launch<gelu_forward_kernel<F, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), out, inp, n);
  CUDA_CHECK_LAUNCH();
}

// inp, dout (n). Accumulates dinp (n) += gelu'(inp) * dout.
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  if (n == 0) return;
  constexpr int W = kPack<F>;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout))
    launch<gelu_backward_kernel<F, W>>(blocks_for(n / W, kThreads), kThreads, 0, stream(), dinp,
                                       inp, dout, n);
  else
    launch<gelu_backward_kernel<F, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), dinp, inp,
                                       dout, n);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void gelu_forward<F>(F*, const F*, size_t);                                            \
  template void gelu_backward<F>(F*, const F*, const F*, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
