// Linear layer (torch nn.Linear layout): forward and backward through cuBLAS, twin of matmul.cpp.
#include <vector>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

// out (N,OC): each row = bias (OC) when `add` is false, += bias when true. A thread handles W
// consecutive columns of one row; the host picks W = 16 bytes when OC is a multiple of it and
// both pointers are aligned (then every row starts aligned too), else W = 1.
template <typename F, int W>
__global__ void bias_rows_kernel(F* out, const F* bias, int N, int OC, bool add) {
  const int packs = OC / W;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * packs) return;
  const int col = int(i % packs) * W;
  const size_t at = (i / packs) * size_t(OC) + col;
  const Pack<F, W> b = load_pack<F, W>(bias + col);
  Pack<F, W> o = b;
  if (add) {
    o = load_pack<F, W>(out + at);
#pragma unroll
    for (int k = 0; k < W; k++) o.v[k] = from_float<F>(to_float(o.v[k]) + to_float(b.v[k]));
  }
  store_pack<F, W>(out + at, o);
}

template <typename F>
void bias_rows(F* out, const F* bias, int N, int OC, bool add) {
  if (N <= 0 || OC <= 0) return;
  constexpr int W = kPack<F>;
  constexpr int kThreads = 256;
  if (OC % W == 0 && aligned16(out) && aligned16(bias)) {
    launch<bias_rows_kernel<F, W>>(blocks_for(size_t(N) * (OC / W), kThreads), kThreads, 0,
                                   stream(), out, bias, N, OC, add);
  } else {
    launch<bias_rows_kernel<F, 1>>(blocks_for(size_t(N) * OC, kThreads), kThreads, 0, stream(), out,
                                   bias, N, OC, add);
  }
  CUDA_CHECK_LAUNCH();
}

// Pass 1 of dbias (OC) += column sums of dout (N,OC) (common.cuh's ColumnSplit): block (x, y)
// sums rows [y * per, (y + 1) * per) of columns [32x, 32x + 32); thread (x,y) takes every 32nd of
// those rows in one column (a warp reads 32 adjacent columns of one row: coalesced), then the 32
// partials of a column are added in a fixed order.
template <typename F>
__global__ void column_sum_kernel(float* partial, const F* dout, int N, int OC, int per) {
  // +1: the column-wise read below has no conflicts
  TESSERA_SHARED(float, part, [kWarp][kWarp + 1]);
  const int col = blockIdx.x * kWarp + threadIdx.x;
  const int begin = blockIdx.y * per, end = begin + per < N ? begin + per : N;
  float s = 0.0f;
  if (col < OC)
    for (int n = begin + threadIdx.y; n < end; n += kWarp) s += to_float(dout[size_t(n) * OC + col]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= OC) return;
  float total = 0.0f;
  for (int y = 0; y < kWarp; y++) total += part[y][threadIdx.x];
  partial[size_t(blockIdx.y) * OC + col] = total;
}

}  // namespace

// out (N,OC) = inp (N,IC) · weightᵀ (IC,OC) + bias (OC); weight (OC,IC); bias may be nullptr.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias) {  // preload the bias so the product adds onto it in the same pass (beta = 1)
    bias_rows(out, bias, N, OC, /*add=*/false);
    beta = 1.0f;
  }
  gemm<F>(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

// out (N,OC) += bias (OC): the bias of a row-parallel layer, added once after the partial
// products of the tensor-parallel ranks are summed.
template <typename F>
void bias_add(F* out, const F* bias, int N, int OC) {
  bias_rows(out, bias, N, OC, /*add=*/true);
}

// dout (N,OC), inp (N,IC), weight (OC,IC). Accumulates dinp (N,IC), dweight (OC,IC), dbias (OC);
// dinp and dbias may be nullptr. dweight is fp32 whatever F is: cuBLAS reads bf16 dout and inp
// and adds the fp32 product into the fp32 gradient (beta = 1), so micro-batches sum in fp32.
template <typename F>
void matmul_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                     const F* weight, int N, int IC, int OC) {
  if (dinp) gemm<F>(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
  gemm_ex(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, data_type<F>(), 1.0f, dweight, IC,
          CUDA_R_32F);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

// dbias (OC) += column sums of dout (N,OC), in a fixed order (common.cuh's ColumnSplit).
template <typename F>
void bias_backward(float* dbias, const F* dout, int N, int OC) {
  if (OC <= 0 || N <= 0) return;
  const ColumnSplit split = column_split(N, OC, 1);
  launch<column_sum_kernel<F>>(dim3(blocks_for(size_t(OC), kWarp), unsigned(split.chunks)),
                               dim3(kWarp, kWarp), 0, stream(), column_scratch(), dout, N, OC,
                               split.rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  add_column_partials(dbias, column_scratch(), split.chunks, OC);
}

// Each held expert's linear layer on its block of rows (ops.hpp), as matmul_forward per expert,
// or grouped: the biases preloaded, then one grouped product over the experts.
template <typename F>
void experts_forward(F* out, const F* inp, const F* weight, const F* bias, const int* counts,
                     const int* offsets, int held, int IC, int OC) {
  const bool grouped = device::grouped_experts();
  std::vector<GroupedProduct> products;
  for (int e = 0; e < held; e++) {
    const int n = counts[e];
    if (n == 0) continue;
    const size_t r0 = size_t(offsets[e]);
    const F* b = bias ? bias + size_t(e) * OC : nullptr;
    const F* w = weight + size_t(e) * OC * IC;
    if (!grouped) {
      matmul_forward(out + r0 * OC, inp + r0 * IC, w, b, n, IC, OC);
      continue;
    }
    if (b) bias_rows(out + r0 * OC, b, n, OC, /*add=*/false);
    products.push_back({n, IC, inp + r0 * IC, w, out + r0 * OC, b ? 1.0f : 0.0f});
  }
  gemm_grouped(false, true, OC, 1.0f, products.data(), int(products.size()), IC, IC,
               data_type<F>(), OC, data_type<F>());
}

template <typename F>
void experts_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                      const F* weight, const int* counts, const int* offsets, int held, int IC,
                      int OC) {
  const bool grouped = device::grouped_experts();
  // The weight gradient groups only where its operands are fp32 like the sum it adds into.
  const bool group_dweight = grouped && data_type<F>() == CUDA_R_32F;
  std::vector<GroupedProduct> dinps, dweights;
  for (int e = 0; e < held; e++) {
    const int n = counts[e];
    if (n == 0) continue;
    const size_t r0 = size_t(offsets[e]);
    const F* w = weight + size_t(e) * OC * IC;
    const F* dout_e = dout + r0 * OC;
    const F* inp_e = inp + r0 * IC;
    float* dw = dweight + size_t(e) * OC * IC;
    float* db = dbias ? dbias + size_t(e) * OC : nullptr;
    if (!grouped) {
      matmul_backward(dinp ? dinp + r0 * IC : nullptr, dw, db, dout_e, inp_e, w, n, IC, OC);
      continue;
    }
    if (dinp) dinps.push_back({n, OC, dout_e, w, dinp + r0 * IC, 1.0f});
    if (group_dweight)
      dweights.push_back({OC, n, dout_e, inp_e, dw, 1.0f});
    else
      gemm_ex(true, false, OC, IC, n, 1.0f, dout_e, OC, inp_e, IC, data_type<F>(), 1.0f, dw, IC,
              CUDA_R_32F);
    if (db) bias_backward(db, dout_e, n, OC);
  }
  gemm_grouped(false, false, IC, 1.0f, dinps.data(), int(dinps.size()), OC, IC, data_type<F>(),
               IC, data_type<F>());
  gemm_grouped(true, false, IC, 1.0f, dweights.data(), int(dweights.size()), OC, IC, CUDA_R_32F,
               IC, CUDA_R_32F);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void experts_forward<F>(F*, const F*, const F*, const F*, const int*, const int*, int, \
                                   int, int);                                                     \
  template void experts_backward<F>(F*, float*, float*, const F*, const F*, const F*, const int*, \
                                    const int*, int, int, int);                                   \
  template void bias_add<F>(F*, const F*, int, int);                                             \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int, int, int);               \
  template void matmul_backward<F>(F*, float*, float*, const F*, const F*, const F*, int, int, int); \
  template void bias_backward<F>(float*, const F*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cuda
