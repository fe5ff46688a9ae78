// Elementwise sums of the residual stream, and the column copies of context parallelism; twin of
// residual.cpp.
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

// dst rows ld_dst apart = (Add: +=) columns [0, cols) of src rows ld_src apart; a thread an
// element, adjacent threads adjacent columns of a row.
template <typename F, bool Add>
__global__ void columns_kernel(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows,
                               size_t cols) {
  const size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (e >= rows * cols) return;
  const size_t r = e / cols, c = e % cols;
  F* y = dst + r * ld_dst + c;
  const F x = src[r * ld_src + c];
  if constexpr (Add) *y = from_float<F>(to_float(*y) + to_float(x));
  else *y = x;
}

__global__ void fill_kernel(float* x, size_t n, float value) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

template <typename F, bool Add>
void columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols) {
  if (rows == 0 || cols == 0) return;
  launch<columns_kernel<F, Add>>(blocks_for(rows * cols, kThreads), kThreads, 0, stream(), dst,
                                 ld_dst, src, ld_src, rows, cols);
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

template <typename F>
void copy_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols) {
  columns<F, false>(dst, ld_dst, src, ld_src, rows, cols);
}

template <typename F>
void add_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols) {
  columns<F, true>(dst, ld_dst, src, ld_src, rows, cols);
}

void fill(float* x, size_t n, float value) {
  if (n == 0) return;
  launch<fill_kernel>(blocks_for(n, kThreads), kThreads, 0, stream(), x, n, value);
  CUDA_CHECK_LAUNCH();
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void residual_forward<F>(F*, const F*, const F*, size_t);                              \
  template void add_inplace<F>(F*, const F*, size_t);                                            \
  template void copy_columns<F>(F*, size_t, const F*, size_t, size_t, size_t);                    \
  template void add_columns<F>(F*, size_t, const F*, size_t, size_t, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
