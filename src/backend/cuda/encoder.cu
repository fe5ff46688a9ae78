// Token + position embedding; twin of encoder.cpp.
#include <limits>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
// encoder_backward's dwte: vocabulary rows are dealt to this many buckets (row % kBuckets).
constexpr int kBuckets = 64;

// out (B,T,C): thread i writes W consecutive channels of one position. W = 16 bytes when C is a
// multiple of it and every pointer is aligned (so every row is), else 1.
template <typename F, int W>
__global__ void encoder_forward_kernel(F* out, const int32_t* tokens, const F* wte, const F* wpe,
                                       int BT, int T, int C, int v0, int vcount,
                                       const int32_t* positions) {
  const int packs = C / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(BT) * packs) return;
  const int bt = int(i / packs), c = int(i % packs) * W;
  const int row = tokens[bt] - v0;
  Pack<F, W> o;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; k++) acc[k] = 0.0f;
  if (row >= 0 && row < vcount) {  // another tensor-parallel rank holds other rows
    const Pack<F, W> e = load_pack<F, W>(wte + size_t(row) * C + c);
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] += to_float(e.v[k]);
  }
  if (wpe) {
    const size_t pos = positions ? size_t(positions[bt]) : size_t(bt % T);
    const Pack<F, W> p = load_pack<F, W>(wpe + pos * C + c);
#pragma unroll
    for (int k = 0; k < W; k++) acc[k] += to_float(p.v[k]);
  }
#pragma unroll
  for (int k = 0; k < W; k++) o.v[k] = from_float<F>(acc[k]);
  store_pack<F, W>(out + size_t(bt) * C + c, o);
}

// dwte (vcount,C) += dout rows of the tokens in [v0, v0 + vcount).
// Tokens repeat, and float atomics would make the sum order (and the bits) vary between runs. So
// each dwte element has one owner: block (x, y) is channels [32x, 32x + 32) of the rows in bucket
// y (row % kBuckets == y); its threads walk every position in order and add only their rows'.
// That is the CPU twin's order exactly (positions in order into dwte), and a warp's branch is
// uniform (one row at a time); most positions are a cached token read and a skip.
template <typename F>
__global__ void encoder_backward_wte_kernel(float* dwte, const F* dout, const int32_t* tokens,
                                            int BT, int C, int v0, int vcount) {
  const int c = blockIdx.x * kWarp + threadIdx.x;
  const int bucket = blockIdx.y;
  if (c >= C) return;
  for (int p = 0; p < BT; p++) {
    const int row = tokens[p] - v0;
    if (row < 0 || row >= vcount || row % kBuckets != bucket) continue;
    dwte[size_t(row) * C + c] += to_float(dout[size_t(p) * C + c]);
  }
}

// dwpe (T,C) += sum over b of dout[b,t,:]: one thread per (t, c), the batch in order.
template <typename F>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const F* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(T) * C) return;
  float* p = dwpe + i;
  for (int b = 0; b < B; b++) *p += to_float(dout[size_t(b) * T * C + i]);
}

}  // namespace

// out (B,T,C) = wte[tokens[b,t] - v0, :] + wpe[t, :]; a token outside [v0, v0 + vcount)
// contributes 0 (vocab-parallel: the sum over tensor-parallel ranks completes it).
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C,
                     int v0, int vcount, const int32_t* positions) {
  const int BT = B * T;
  if (BT <= 0 || C <= 0) return;
  constexpr int W = kPack<F>;
  if (C % W == 0 && aligned16(out) && aligned16(wte) && (!wpe || aligned16(wpe)))
    launch<encoder_forward_kernel<F, W>>(blocks_for(size_t(BT) * (C / W), kThreads), kThreads, 0,
                                         stream(), out, tokens, wte, wpe, BT, T, C, v0, vcount,
                                         positions);
  else
    launch<encoder_forward_kernel<F, 1>>(blocks_for(size_t(BT) * C, kThreads), kThreads, 0,
                                         stream(), out, tokens, wte, wpe, BT, T, C, v0, vcount,
                                         positions);
  CUDA_CHECK_LAUNCH();
}

// dout (B,T,C), tokens (B,T). Accumulates dwte (vcount,C) and dwpe unless nullptr. With
// positions, rows of wpe repeat as tokens do: their sums take the tokens' kernel (positions in
// order, one owner per element; every position is a row of wpe).
template <typename F>
void encoder_backward(float* dwte, float* dwpe, const F* dout, const int32_t* tokens, int B, int T,
                      int C, int v0, int vcount, const int32_t* positions) {
  if (B * T <= 0 || C <= 0) return;
  if (vcount > 0) {
    const dim3 grid(blocks_for(size_t(C), kWarp), kBuckets);
    launch<encoder_backward_wte_kernel<F>>(grid, kWarp, 0, stream(), dwte, dout, tokens, B * T, C,
                                           v0, vcount);
    CUDA_CHECK_LAUNCH();
  }
  if (dwpe && positions) {
    const dim3 grid(blocks_for(size_t(C), kWarp), kBuckets);
    launch<encoder_backward_wte_kernel<F>>(grid, kWarp, 0, stream(), dwpe, dout, positions, B * T,
                                           C, 0, std::numeric_limits<int>::max());
    CUDA_CHECK_LAUNCH();
  } else if (dwpe) {
    launch<encoder_backward_wpe_kernel<F>>(blocks_for(size_t(T) * C, kThreads), kThreads, 0,
                                           stream(), dwpe, dout, B, T, C);
    CUDA_CHECK_LAUNCH();
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int, int, int,  \
                                   const int32_t*);                                                \
  template void encoder_backward<F>(float*, float*, const F*, const int32_t*, int, int, int, int,  \
                                    int, const int32_t*);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
