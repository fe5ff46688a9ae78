// FP8 GEMMs on the GPU; twin of backend/cpu/fp8.cpp. The rounding is CUDA's own (cuda_fp8.h:
// __nv_cvt_float_to_fp8 with saturation to the largest finite value, round to nearest even; a
// hardware instruction on sm_89 and later), so the op tests compare it with tessera's independent
// codec (common/fp8_format.hpp) through the CPU op. The GEMM is cuBLASLt's on one-byte operands (FP8
// tensor cores) where it takes the shape, else a tiled kernel of ours with the same definition.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kReduceThreads = 512;

// Pass 1 of the amax: each block's largest |x| and its count of NaNs, into partial[2b], [2b+1].
template <typename F>
__global__ void amax_partial_kernel(double* partial, const F* x, size_t n) {
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  float m = 0.0f;
  double nan = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float a = fabsf(to_float(x[i]));
    if (a != a) nan += 1.0;
    else m = fmaxf(m, a);
  }
  m = block_max(m, shared_max);
  nan = block_sum(nan, shared_nan);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = m;
    partial[2 * blockIdx.x + 1] = nan;
  }
}

// Pass 2 of an amax, in one block: the largest of `count` partials (max, NaN count) of pass 1 and
// their NaNs, in every thread.
struct Amax {
  float max;
  double nans;
};
__device__ Amax fold_partials(const double* partial, int count, float* shared_max,
                              double* shared_nan) {
  float m = 0.0f;
  double nan = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    m = fmaxf(m, float(partial[2 * i]));
    nan += partial[2 * i + 1];
  }
  return {block_max(m, shared_max), block_sum(nan, shared_nan)};
}

// fp8_amax's pass 2: the result into partial[0] (max) and partial[1] (NaNs).
__global__ void amax_finish_kernel(double* partial, int count) {
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  const Amax a = fold_partials(partial, count, shared_max, shared_nan);
  __syncthreads();  // every thread has read its partials before thread 0 overwrites the first
  if (threadIdx.x == 0) {
    partial[0] = a.max;
    partial[1] = a.nans;
  }
}

constexpr __nv_fp8_interpretation_t interpretation(Fp8Format f) {
  return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// A code's value (exact: every FP8 value is a half).
__device__ __forceinline__ float fp8_value(uint8_t code, __nv_fp8_interpretation_t f) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, f)));
}

// The 32 x 32 tiles of a (rows, cols) matrix, a block of 256 threads taking one tile at a time:
// code(at) gives element at's code (a warp reads one row's 32 columns: coalesced), and through
// shared memory the tile goes to out_t transposed (a warp writes one row of out_t: coalesced),
// unless out_t is null.
constexpr int kTile = 32;
constexpr int kCastThreads = 256;
// The 32 x 32 tiles of a (rows, cols) matrix (0 for an empty one).
inline int tile_count(int rows, int cols) {
  return rows > 0 && cols > 0 ? ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile) : 0;
}

template <typename Code>
__device__ void transpose_tiles(uint8_t* out_t, int rows, int cols,
                                uint8_t (&tile)[kTile][kTile + 1], Code code) {
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile, step = kCastThreads / kTile;
  const int tile_cols = (cols + kTile - 1) / kTile;
  const int tiles = tile_cols * ((rows + kTile - 1) / kTile);
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int r0 = t / tile_cols * kTile, c0 = t % tile_cols * kTile;
    for (int i = ty; i < kTile; i += step) {
      const int r = r0 + i, c = c0 + tx;
      if (r < rows && c < cols) tile[i][tx] = code(size_t(r) * cols + c);
    }
    if (out_t == nullptr) continue;  // the same for the whole block
    __syncthreads();
    for (int i = ty; i < kTile; i += step) {
      const int c = c0 + i, r = r0 + tx;
      if (c < cols && r < rows) out_t[size_t(c) * rows + r] = tile[tx][i];
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
}

// fp8_cast's pass 1: the tiles of in cast, each code to out as read and to out_t transposed;
// each block's largest |in| and count of NaNs into partial[2b], [2b+1].
template <typename F, __nv_fp8_interpretation_t kFormat>
__global__ void cast_kernel(uint8_t* out, uint8_t* out_t, const F* in, int rows, int cols,
                            float scale, double* partial) {
  TESSERA_SHARED(uint8_t, tile, [kTile][kTile + 1]);
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  float m = 0.0f;
  double nan = 0.0;
  transpose_tiles(out_t, rows, cols, tile, [&](size_t at) {
    const float v = to_float(in[at]);
    const float a = fabsf(v);
    if (a != a) nan += 1.0;
    else m = fmaxf(m, a);
    const uint8_t code = __nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kFormat);
    if (out) out[at] = code;
    return code;
  });
  m = block_max(m, shared_max);
  nan = block_sum(nan, shared_nan);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = m;
    partial[2 * blockIdx.x + 1] = nan;
  }
}

// fp8_place: the tiles of codes already cast, copied to out as read and to out_t transposed;
// block 0 writes the operand's scale.
__global__ void place_kernel(uint8_t* out, uint8_t* out_t, const uint8_t* in, int rows, int cols,
                             float scale_inv, float* scale_inv_slot) {
  TESSERA_SHARED(uint8_t, tile, [kTile][kTile + 1]);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_slot = scale_inv;
  transpose_tiles(out_t, rows, cols, tile, [&](size_t at) {
    out[at] = in[at];
    return in[at];
  });
}

// fp8_cast's pass 2: one block folds the partials into *amax, and writes the operand's scale.
__global__ void cast_finish_kernel(float* amax, float* scale_inv, const double* partial, int count,
                                   float inv) {
  TESSERA_SHARED(float, shared_max, [kWarp]);
  TESSERA_SHARED(double, shared_nan, [kWarp]);
  const Amax a = fold_partials(partial, count, shared_max, shared_nan);
  if (threadIdx.x != 0) return;
  const float old = *amax;
  *amax = a.nans > 0 || old != old ? NAN : fmaxf(old, a.max);
  *scale_inv = inv;
}

// fp8_gemm where cuBLASLt does not take the shape: d (M,N) from 16 x 16 tiles of X and Y decoded
// into shared memory, one output per thread, K in steps of 16; the products of FP8 values are
// exact in fp32, the sum is in k order.
constexpr int kGemmTile = 16;
template <typename D, typename F>
__global__ void gemm_kernel(D* d, const uint8_t* x, const uint8_t* y, const float* x_inv,
                            const float* y_inv, const F* bias, int M, int N, int K,
                            __nv_fp8_interpretation_t fx, __nv_fp8_interpretation_t fy,
                            bool accumulate) {
  TESSERA_SHARED(float, xs, [kGemmTile][kGemmTile + 1]);
  TESSERA_SHARED(float, ys, [kGemmTile][kGemmTile + 1]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.x * kGemmTile + ty, col = blockIdx.y * kGemmTile + tx;
  const int y_row = blockIdx.y * kGemmTile + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kGemmTile) {
    const int k = k0 + tx;
    xs[ty][tx] = row < M && k < K ? fp8_value(x[size_t(row) * K + k], fx) : 0.0f;
    ys[ty][tx] = y_row < N && k < K ? fp8_value(y[size_t(y_row) * K + k], fy) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kGemmTile; j++) acc += xs[ty][j] * ys[tx][j];
    __syncthreads();
  }
  if (row >= M || col >= N) return;
  D& out = d[size_t(row) * N + col];
  float v = *x_inv * *y_inv * acc;
  if (accumulate) v += to_float(out);
  if (bias) v += to_float(bias[col]);
  out = from_float<D>(v);
}

}  // namespace

template <typename F>
float fp8_amax(const F* x, size_t n) {
  if (n == 0) return 0.0f;
  const size_t want = (n + kReduceThreads - 1) / kReduceThreads;
  const int grid = int(want < size_t(kScratchDoubles / 2) ? want : size_t(kScratchDoubles / 2));
  double* partial = scratch();
  launch<amax_partial_kernel<F>>(grid, kReduceThreads, 0, stream(), partial, x, n);
  CUDA_CHECK_LAUNCH();
  launch<amax_finish_kernel>(1, kReduceThreads, 0, stream(), partial, grid);
  CUDA_CHECK_LAUNCH();
  double result[2];
  to_host(result, partial, sizeof result);
  return result[1] > 0 ? NAN : float(result[0]);
}

template <typename F>
void fp8_cast(uint8_t* out, uint8_t* out_t, const F* in, int rows, int cols, float scale,
              Fp8Format format, float* amax, float* scale_inv) {
  const int tiles = tile_count(rows, cols);
  const int grid = tiles < kScratchDoubles / 2 ? tiles : kScratchDoubles / 2;
  double* partial = scratch();
  if (grid > 0) {
    if (format == Fp8Format::E4M3)
      launch<cast_kernel<F, __NV_E4M3>>(grid, kCastThreads, 0, stream(), out, out_t, in, rows, cols,
                                        scale, partial);
    else
      launch<cast_kernel<F, __NV_E5M2>>(grid, kCastThreads, 0, stream(), out, out_t, in, rows, cols,
                                        scale, partial);
    CUDA_CHECK_LAUNCH();
  }
  launch<cast_finish_kernel>(1, kReduceThreads, 0, stream(), amax, scale_inv,
                             static_cast<const double*>(partial), grid, 1.0f / scale);
  CUDA_CHECK_LAUNCH();
}

void fp8_place(uint8_t* out, uint8_t* out_t, const uint8_t* in, int rows, int cols, float scale_inv,
               float* scale_inv_slot) {
  const int tiles = tile_count(rows, cols);
  const int grid = tiles < 1 ? 1 : tiles < 65535 ? tiles : 65535;
  launch<place_kernel>(grid, kCastThreads, 0, stream(), out, out_t, in, rows, cols, scale_inv,
                       scale_inv_slot);
  CUDA_CHECK_LAUNCH();
}

namespace {

long lt_gemms = 0, kernel_gemms = 0;
std::set<std::string> refused;      // the shapes gemm_kernel ran, "MxNxK"
std::set<std::string> run_refused;  // the calls cublasLtMatmul refused after its heuristic's yes

// A GEMM shape's cuBLASLt descriptors and the algorithm its heuristic chose, made once.
struct LtPlan {
  bool supported = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// M, N, K, the operands' formats, D's type, a bias or not (beta is the matmul's own argument),
// and the alignment in bytes the chosen algorithm may assume of A, B and C/D (alignment()).
using LtKey = std::tuple<int, int, int, Fp8Format, Fp8Format, cudaDataType_t, bool, uint32_t,
                         uint32_t, uint32_t>;

// The largest power of two up to 256 dividing an operand's address and its leading dimension in
// bytes. cuBLASLt's heuristic assumes 256 unless told otherwise
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, default 256) and may return an algorithm
// that needs it; tessera's FP8 codes sit at 16-byte offsets in the arena.
uint32_t alignment(const void* p, size_t ld_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld_bytes) | uintptr_t(256);
  return uint32_t(bits & (~bits + 1));
}

cudaDataType_t lt_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t what, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, what, &value, sizeof value));
}

// Column-major, cuBLASLt's FP8 kernels take only "TN": D (N,M) = op(A)ᵀ B with A = Y stored
// (K,N), transposed, and B = X stored (K,M); the row-major d (M,N) is that D. The bias is added
// per row of D, so per column of d.
LtPlan& lt_plan(const LtKey& key) {
  // Never destroyed: at exit cuBLASLt's own state may be gone before static destructors run.
  static auto* const plans = new std::map<LtKey, LtPlan>;
  auto [it, fresh] = plans->try_emplace(key);
  LtPlan& p = it->second;
  if (!fresh) return p;
  const auto [M, N, K, fx, fy, d_type, bias, align_a, align_b, align_d] = key;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (bias) {
    set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, lt_type(fy), uint64_t(K), uint64_t(N), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, lt_type(fx), uint64_t(K), uint64_t(M), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, d_type, uint64_t(N), uint64_t(M), N));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = device::blas_workspace_bytes();
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace, sizeof workspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attribute, bytes] : alignments)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      device::blas_lt(), p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm is not an error: the shape goes to gemm_kernel.
  p.supported = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.supported) p.algo = result.algo;
  return p;
}

template <typename D, typename F>
bool lt_gemm(D* d, const Fp8Operand& x, const Fp8Operand& y, int M, int N, int K, const F* bias,
             bool accumulate) {
  // cuBLASLt's FP8 kernels: a bf16 bias, dimensions in multiples of 16, 16-byte aligned
  // operands, not both E5M2.
  if constexpr (!std::is_same_v<F, bf16>) return false;
  if (M % 16 || N % 16 || K % 16 || K == 0 || !aligned16(d) || !aligned16(x.codes) ||
      !aligned16(y.codes) || (bias && !aligned16(bias)))
    return false;
  if (x.format == Fp8Format::E5M2 && y.format == Fp8Format::E5M2) return false;
  // A is Y's codes, B is X's (lt_plan), each K bytes a column; C and D are d, N elements a column.
  LtPlan& p = lt_plan({M, N, K, x.format, y.format, data_type<D>(), bias != nullptr,
                       alignment(y.codes, size_t(K)), alignment(x.codes, size_t(K)),
                       alignment(d, size_t(N) * sizeof(D))});
  if (!p.supported) return false;
  set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, y.scale_inv);
  set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x.scale_inv);
  if (bias) set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cublasStatus_t status = cublasLtMatmul(
      device::blas_lt(), p.desc, &alpha, y.codes, p.a, x.codes, p.b, &beta, d, p.c, d, p.c,
      &p.algo, device::blas_workspace(), device::blas_workspace_bytes(), stream());
  // The heuristic sees neither beta nor the scale and bias pointers, and cuBLASLt may still turn
  // the call down: the plan is dropped (tessera's kernel takes this key from now on) and the call
  // is named in fp8_report, so that a slow FP8 run says why.
  if (status == CUBLAS_STATUS_SUCCESS) {
    ++lt_gemms;
    return true;
  }
  const std::string call =
      std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
      (bias ? " bias" : "") + (accumulate ? " beta=1" : "") + " scales at " +
      std::to_string(reinterpret_cast<uintptr_t>(x.scale_inv) % 16) + "," +
      std::to_string(reinterpret_cast<uintptr_t>(y.scale_inv) % 16) + " mod 16";
  if (status != CUBLAS_STATUS_NOT_SUPPORTED)
    device::fail(("cublasLtMatmul (FP8 " + call + ")").c_str(), device::cublas_reason(status),
                 __FILE__, __LINE__);
  p.supported = false;
  if (run_refused.size() < 8) run_refused.insert(call);
  return false;
}

}  // namespace

template <typename D, typename F>
void fp8_gemm(D* d, const Fp8Operand& x, const Fp8Operand& y, int M, int N, int K, const F* bias,
              bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (lt_gemm(d, x, y, M, N, K, bias, accumulate)) return;
  ++kernel_gemms;
  if (refused.size() < 8)
    refused.insert(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
  launch<gemm_kernel<D, F>>(dim3(blocks_for(size_t(M), kGemmTile), blocks_for(size_t(N), kGemmTile)),
                            dim3(kGemmTile, kGemmTile), 0, stream(), d, x.codes, y.codes,
                            x.scale_inv, y.scale_inv, bias, M, N, K, interpretation(x.format),
                            interpretation(y.format), accumulate);
  CUDA_CHECK_LAUNCH();
}

long fp8_lt_gemms() { return lt_gemms; }

std::string fp8_report() {
  if (lt_gemms + kernel_gemms == 0) return "";
  std::string shapes;
  for (const std::string& r : refused) shapes += (shapes.empty() ? "" : ", ") + r;
  std::string later;
  for (const std::string& r : run_refused) later += (later.empty() ? "" : ", ") + r;
  return "fp8: " + std::to_string(lt_gemms) + " GEMMs so far on cuBLASLt's FP8 kernels, " +
         std::to_string(kernel_gemms) + " on tessera's" +
         (shapes.empty() ? "" : " (M x N x K " + shapes + ": not multiples of 16, or fp32)") +
         (later.empty() ? "" : "; cublasLtMatmul refused " + later);
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template float fp8_amax<F>(const F*, size_t);                                                  \
  template void fp8_cast<F>(uint8_t*, uint8_t*, const F*, int, int, float, Fp8Format, float*,  \
                            float*);                                                           \
  template void fp8_gemm<F, F>(F*, const Fp8Operand&, const Fp8Operand&, int, int, int, const F*, \
                               bool);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(bf16)
#undef TESSERA_INSTANTIATE
template void fp8_gemm<float, bf16>(float*, const Fp8Operand&, const Fp8Operand&, int, int, int,
                                    const bf16*, bool);

}  // namespace tessera::cuda
