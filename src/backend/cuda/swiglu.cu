// SwiGLU, LLaMA's MLP activation: silu(gate) * up on the packed (gate | up) rows of the fused
// gate/up projection; twin of swiglu.cpp.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// expf, not __expf: the fast intrinsic's error would break the 1e-5 parity. expf overflowing to
// inf for very negative g gives silu -0 and sigmoid 0, the right limits.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// d(gate) += dout * up * silu'(gate), silu'(g) = sg (1 + g (1 - sg)), sg = sigmoid(g);
// d(up) += dout * silu(gate).
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  const float e1 = 1.0f + expf(-g), sg = 1.0f / e1;
  dg += d * u * (sg * (1.0f + g * (1.0f - sg)));
  du += d * (g / e1);
}

// Thread i handles outputs [i*W, i*W + W) of the flat (N,H) output: row e / H, columns from
// e % H, e = i*W. The packed path (W > 1) is taken only when H is a multiple of W (and the
// pointers are 16-byte aligned), so a pack never straddles two rows and no tail is left over;
// otherwise W = 1.
template <typename F, int W>
__global__ void swiglu_forward_kernel(F* out, const F* inp, int N, int H) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * H / W) return;
  const size_t e = i * W, at = e / H * 2 * H + e % H;
  const Pack<F, W> g = load_pack<F, W>(inp + at);
  const Pack<F, W> u = load_pack<F, W>(inp + at + H);
  Pack<F, W> y;
#pragma unroll
  for (int k = 0; k < W; k++) y.v[k] = from_float<F>(silu(to_float(g.v[k])) * to_float(u.v[k]));
  store_pack<F, W>(out + e, y);
}

template <typename F, int W>
__global__ void swiglu_backward_kernel(F* dinp, const F* inp, const F* dout, int N, int H) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * H / W) return;
  const size_t e = i * W, at = e / H * 2 * H + e % H;
  const Pack<F, W> g = load_pack<F, W>(inp + at);
  const Pack<F, W> u = load_pack<F, W>(inp + at + H);
  const Pack<F, W> d = load_pack<F, W>(dout + e);
  Pack<F, W> dg = load_pack<F, W>(dinp + at);
  Pack<F, W> du = load_pack<F, W>(dinp + at + H);
#pragma unroll
  for (int k = 0; k < W; k++) {
    float a = to_float(dg.v[k]), b = to_float(du.v[k]);
    swiglu_grad(to_float(g.v[k]), to_float(u.v[k]), to_float(d.v[k]), a, b);
    dg.v[k] = from_float<F>(a);
    du.v[k] = from_float<F>(b);
  }
  store_pack<F, W>(dinp + at, dg);
  store_pack<F, W>(dinp + at + H, du);
}

}  // namespace

// inp (N,2H) = (gate | up); out (N,H) = silu(gate) * up.
template <typename F>
void swiglu_forward(F* out, const F* inp, int N, int H) {
  if (N <= 0 || H <= 0) return;
  constexpr int W = kPack<F>;
  const size_t n = size_t(N) * H;
  if (H % W == 0 && aligned16(out) && aligned16(inp))
    launch<swiglu_forward_kernel<F, W>>(blocks_for(n / W, kThreads), kThreads, 0, stream(), out,
                                        inp, N, H);
  else
    launch<swiglu_forward_kernel<F, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), out, inp,
                                        N, H);
  CUDA_CHECK_LAUNCH();
}

// Accumulates dinp (N,2H) from dout (N,H).
template <typename F>
void swiglu_backward(F* dinp, const F* inp, const F* dout, int N, int H) {
  if (N <= 0 || H <= 0) return;
  constexpr int W = kPack<F>;
  const size_t n = size_t(N) * H;
  if (H % W == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))
    launch<swiglu_backward_kernel<F, W>>(blocks_for(n / W, kThreads), kThreads, 0, stream(), dinp,
                                         inp, dout, N, H);
  else
    launch<swiglu_backward_kernel<F, 1>>(blocks_for(n, kThreads), kThreads, 0, stream(), dinp,
                                         inp, dout, N, H);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void swiglu_forward<F>(F*, const F*, int, int);                                        \
  template void swiglu_backward<F>(F*, const F*, const F*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
