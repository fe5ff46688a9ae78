// Rotary position embeddings on the q and k heads of the packed qkv activation, the HF LLaMA
// convention (rotate_half: dimension i pairs with i + hs/2); twin of rope.cpp.
#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per rotated pair (x[i], x[i + hs/2]) of one q or k head of one row: thread e is pair
// i = e % (hs/2) of head (e / (hs/2)) % (NH + NKV) of row e / ((hs/2) (NH + NKV)), so a warp
// reads consecutive dimensions of a head (the q and k heads are the first NH + NKV of a row).
// sin is multiplied by `sign`: +1 the rotation, -1 its transpose (the backward).
template <typename F>
__global__ void rope_kernel(F* qkv, const float* cs, int rows, int T, int NH, int NKV, int hs,
                            float sign) {
  const int half = hs / 2, heads = NH + NKV;
  const size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (e >= size_t(rows) * heads * half) return;
  const int i = int(e % half);
  const size_t head = e / half;
  const int h = int(head % heads);
  const int row = int(head / heads), t = row % T;
  F* x = qkv + size_t(row) * (NH + 2 * NKV) * hs + size_t(h) * hs;
  const float c = cs[(size_t(t) * half + i) * 2], s = sign * cs[(size_t(t) * half + i) * 2 + 1];
  const float a = to_float(x[i]), b = to_float(x[i + half]);
  x[i] = from_float<F>(a * c - b * s);
  x[i + half] = from_float<F>(b * c + a * s);
}

template <typename F>
void rotate(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs, float sign) {
  const size_t pairs = size_t(B) * T * (NH + NKV) * (hs / 2);
  if (pairs == 0) return;
  launch<rope_kernel<F>>(blocks_for(pairs, kThreads), kThreads, 0, stream(), qkv, cs, B * T, T, NH,
                         NKV, hs, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// Rotates the q and k heads of qkv (B,T,(NH+2*NKV)*hs) in place by cs (T, hs/2, 2).
template <typename F>
void rope_forward(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs) {
  rotate(qkv, cs, B, T, NH, NKV, hs, 1.0f);
}

// The transposed rotation (sin -> -sin) of dqkv's q and k heads, in place.
template <typename F>
void rope_backward(F* dqkv, const float* cs, int B, int T, int NH, int NKV, int hs) {
  rotate(dqkv, cs, B, T, NH, NKV, hs, -1.0f);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void rope_forward<F>(F*, const float*, int, int, int, int, int);                       \
  template void rope_backward<F>(F*, const float*, int, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
