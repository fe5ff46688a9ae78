// The CUDA emulator's cuBLASLt: the FP8 GEMM the backend makes (fp8.cu) and the descriptor calls
// around it, as a reference product with cuBLASLt's meaning of every argument:
//
//   D = alpha * scaleA * scaleB * op(A) op(B) + beta * C, then + bias[i] on row i (the BIAS
//   epilogue); column-major, beta == 0 does not read C; the FP8 codes decoded exactly
//   (cuda_fp8.h's host conversions), D stored as fp32 or bf16 (nearest even). The sum over k is
//   accumulated as Hopper's FP8 tensor cores are measured to (TESSERA_EMU_FP8_ACCUM, below), or
//   in fp32.
//
// Only what cuBLASLt's FP8 kernels run is accepted, so that no call passes here that a GPU would
// refuse or that the emulator would compute some other way. The rest is
// CUBLAS_STATUS_NOT_SUPPORTED, from the heuristic and the matmul alike, with the reason on
// stderr: A and B E4M3 or E5M2, not both E5M2; op(A) = T and op(B) = N ("TN"); compute type
// CUBLAS_COMPUTE_32F, scale type CUDA_R_32F; C and D one matrix (same pointer, same layout) of
// CUDA_R_16BF or CUDA_R_32F; a bias of CUDA_R_16BF; m, n, k and every ld multiples of 16; A, B,
// D and the bias 16-byte aligned, and to the alignment the heuristic's algorithm was chosen for
// (the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256, as far as the leading
// dimension allows); a compute capability of 8.9 or later (TESSERA_EMU_COMPUTE; the
// default 0.0 is the emulator itself, allowed). A descriptor attribute other than those fp8.cu
// sets is refused when it is set.
//
// Layouts whose dimensions do not fit together (A not k x m for op T, ...) or whose ld is below
// their rows are CUBLAS_STATUS_INVALID_VALUE; an operand whose extent runs outside its device
// allocation is CUBLAS_STATUS_EXECUTION_FAILED (an illegal address on a GPU), as in cublas.cpp.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <string>
#include <type_traits>
#include <vector>

#include "device/emu/blas.hpp"
#include "device/emu/memory.hpp"
#include "device/emu/races.hpp"
#include "device/emu/streams.hpp"

// No state: cublasLtMatmul is given its stream and everything else by its descriptors.
struct cublasLtContext {};

namespace tessera::emu {
namespace {

// Each descriptor's state lives in the data array of the header's semi-opaque struct that
// cublasLt...Create allocates, as the library's own does.
struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType scale_type;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  const void* a_scale = nullptr;  // device floats; null means 1, as cuBLASLt
  const void* b_scale = nullptr;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // cuBLASLt's "not set"
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
// The alignments (bytes) the caller promises of A, B, C and D: cuBLASLt's default is 256.
struct Preference {
  uint64_t max_workspace = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};
};
// What the heuristic writes into the algorithm it returns, and the matmul holds the operands to:
// an algorithm chosen for the promised alignments may rely on them (an algorithm's
// CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_*_BYTES).
constexpr uint64_t kAlgoTag = 0x7e55e7a11c0ull;

template <class State, class Opaque>
State& state(Opaque* o) {
  static_assert(sizeof(State) <= sizeof(Opaque::data) && alignof(State) <= alignof(uint64_t));
  return *std::launder(reinterpret_cast<State*>(o->data));
}
template <class Opaque, class State>
cublasStatus_t create(Opaque** out, const State& s) {
  static_assert(std::is_trivially_destructible_v<State>);  // Destroy only deletes the Opaque
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  *out = new Opaque{};
  new (&(*out)->data) State(s);
  return CUBLAS_STATUS_SUCCESS;
}

// An attribute's value, when buf holds exactly a T (cuBLASLt checks sizeInBytes likewise).
template <class T>
cublasStatus_t set(T* to, const void* buf, size_t bytes) {
  if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(to, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

std::string type_name(int t) {
  switch (t) {
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    default: return "cudaDataType " + std::to_string(t);
  }
}
const char* op_name(int32_t op) {
  return op == CUBLAS_OP_N ? "N" : op == CUBLAS_OP_T ? "T" : op == CUBLAS_OP_C ? "C" : "unknown";
}
bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
bool is_output(cudaDataType t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }

float decode(uint8_t code, cudaDataType t) {
  const __half h = __nv_cvt_fp8_to_halfraw(code, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(h);
}

// The device's compute capability as 10 * major + minor (TESSERA_EMU_COMPUTE, runtime.cpp).
int capability() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 0;
  return 10 * prop.major + prop.minor;
}

// How the products of one output are summed (TESSERA_EMU_FP8_ACCUM): `hopper` (the default) a
// model of Hopper's FP8 tensor cores in cuBLASLt's default mode (CUBLASLT_MATMUL_DESC_FAST_ACCUM
// off), `fp32` a sum in fp32 in k order. The hardware's accumulator is not documented; the model
// follows what is published about it:
//   - DeepSeek-V3 technical report (arXiv 2412.19437), section 3.3.2, "Increasing Accumulation
//     Precision": "the accumulation precision of FP8 GEMM on NVIDIA H800 GPUs is limited to
//     retaining around 14 bits", and partial results are promoted to fp32 every N_C = 128
//     elements, "equivalent to 4 WGMMAs";
//   - cublasLt.h on CUBLASLT_MATMUL_DESC_FAST_ACCUM: with it on, "intermediate results will not
//     periodically be promoted to a higher precision" (so, off, they are).
// The model: the products are exact; one MMA takes 32 consecutive k (wgmma's K for 8-bit inputs),
// aligns the partial sum and its 32 products to the largest exponent among them and keeps 13
// significant bits of each (truncated toward zero: the conservative end of "around 14"); every 4
// MMAs (128 k) the partial sum is added to an fp32 accumulator. tests/gpu/test_fp8.cpp bounds
// cuBLASLt's results by the worst case of this model, which a GPU must also meet.
enum class Fp8Accum { Hopper, Fp32 };
constexpr size_t kMmaK = 32;
constexpr size_t kMmasPerPromotion = 4;
constexpr int kMmaBits = 13;

Fp8Accum fp8_accumulation() {
  const char* s = std::getenv("TESSERA_EMU_FP8_ACCUM");
  const std::string v = s ? s : "";
  if (v.empty() || v == "hopper") return Fp8Accum::Hopper;
  if (v == "fp32") return Fp8Accum::Fp32;
  fault("TESSERA_EMU_FP8_ACCUM=" + v + ": expected hopper or fp32");
}

// x toward zero to a multiple of `grid` (a power of two).
double truncated(double x, double grid) { return std::trunc(x / grid) * grid; }

// The sum of a[q] * b[q] over q < k, accumulated as `mode` says.
float fp8_dot(const float* a, const float* b, size_t k, Fp8Accum mode) {
  float acc = 0.0f;
  if (mode == Fp8Accum::Fp32) {
    for (size_t q = 0; q < k; q++) acc += a[q] * b[q];
    return acc;
  }
  // Every truncated term is a multiple of the MMA's grid below 2^13 grids: 33 of them sum
  // exactly in double, and the partial sum (under 2^19 grids) converts to float exactly.
  double partial = 0.0;
  for (size_t q0 = 0, mma = 1; q0 < k; q0 += kMmaK, mma++) {
    const size_t end = std::min(k, q0 + kMmaK);
    double largest = std::fabs(partial);
    for (size_t q = q0; q < end; q++) largest = std::fmax(largest, std::fabs(double(a[q]) * b[q]));
    if (largest > 0.0) {
      int e = 0;
      std::frexp(largest, &e);  // largest in [2^(e-1), 2^e)
      const double grid = std::ldexp(1.0, e - kMmaBits);
      double sum = truncated(partial, grid);
      for (size_t q = q0; q < end; q++) sum += truncated(double(a[q]) * b[q], grid);
      partial = sum;
    }
    if (mma % kMmasPerPromotion == 0 || end == k) {
      acc += float(partial);
      partial = 0.0;
    }
  }
  return acc;
}

cublasStatus_t refuse(const char* call, const std::string& why) {
  say(std::string(call) + ": not supported: " + why);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

// A product the descriptors describe: op(A) m x k, op(B) k x n, D m x n.
struct Problem {
  MatmulDesc desc;
  Layout a, b, d;
  long long m, n, k;
};

// Whether the descriptors describe a product, and one cuBLASLt's FP8 kernels run (the top of the
// file); the heuristic and the matmul answer alike.
cublasStatus_t check(const char* call, cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                     cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                     cublasLtMatrixLayout_t D, Problem* p) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
  const MatmulDesc& o = state<MatmulDesc>(desc);
  const Layout &a = state<Layout>(A), &b = state<Layout>(B), &c = state<Layout>(C),
               &d = state<Layout>(D);
  const bool a_t = o.trans_a != CUBLAS_OP_N, b_t = o.trans_b != CUBLAS_OP_N;
  const uint64_t m = d.rows, n = d.cols, k = a_t ? a.rows : a.cols;
  const bool fits = (a_t ? a.cols : a.rows) == m && (b_t ? b.cols : b.rows) == k &&
                    (b_t ? b.rows : b.cols) == n && c.rows == m && c.cols == n;
  auto ld_ok = [](const Layout& l) { return l.ld >= 1 && uint64_t(l.ld) >= l.rows; };
  if (!fits || !ld_ok(a) || !ld_ok(b) || !ld_ok(c) || !ld_ok(d)) {
    auto dims = [](const Layout& l) {
      return std::to_string(l.rows) + "x" + std::to_string(l.cols) + " ld " + std::to_string(l.ld);
    };
    say(std::string(call) + ": invalid value: layouts A " + dims(a) + ", B " + dims(b) + ", C " +
        dims(c) + ", D " + dims(d) + " do not make op(A) m x k times op(B) k x n into m x n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (o.compute != CUBLAS_COMPUTE_32F || o.scale_type != CUDA_R_32F)
    return refuse(call, "compute type " + std::to_string(o.compute) + ", scale type " +
                            type_name(o.scale_type) + ": FP8 needs CUBLAS_COMPUTE_32F, CUDA_R_32F");
  if (!is_fp8(a.type) || !is_fp8(b.type))
    return refuse(call, "A " + type_name(a.type) + ", B " + type_name(b.type) +
                            ": only FP8 operands (E4M3, E5M2) are emulated");
  if (a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2)
    return refuse(call, "A and B both CUDA_R_8F_E5M2: FP8 needs one of them E4M3");
  if (o.trans_a != CUBLAS_OP_T || o.trans_b != CUBLAS_OP_N)
    return refuse(call, std::string("op(A) ") + op_name(o.trans_a) + ", op(B) " +
                            op_name(o.trans_b) + ": FP8 needs TN (A transposed, B not)");
  if (!is_output(d.type)) return refuse(call, "D " + type_name(d.type) + ": only fp32 or bf16");
  if (c.type != d.type || c.ld != d.ld)
    return refuse(call, "C and D of different layouts: only C == D is emulated");
  if (o.epilogue != CUBLASLT_EPILOGUE_DEFAULT && o.epilogue != CUBLASLT_EPILOGUE_BIAS)
    return refuse(call, "epilogue " + std::to_string(o.epilogue) + ": only DEFAULT and BIAS");
  if (o.epilogue == CUBLASLT_EPILOGUE_BIAS && o.bias_type != CUDA_R_16BF)
    return refuse(call, "bias of " + type_name(o.bias_type) + ": only CUDA_R_16BF is emulated");
  if (m % 16 || n % 16 || k % 16 || a.ld % 16 || b.ld % 16 || d.ld % 16)
    return refuse(call, "m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                            std::to_string(k) + ", lda " + std::to_string(a.ld) + ", ldb " +
                            std::to_string(b.ld) + ", ldc " + std::to_string(d.ld) +
                            ": FP8 needs multiples of 16");
  if (const int cc = capability(); cc != 0 && cc < 89)
    return refuse(call, "compute capability " + std::to_string(cc / 10) + "." +
                            std::to_string(cc % 10) + " (TESSERA_EMU_COMPUTE): FP8 needs 8.9");
  *p = Problem{o, a, b, d, (long long)m, (long long)n, (long long)k};
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace tessera::emu

using namespace tessera::emu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  return create(desc, MatmulDesc{compute, scale_type});
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  MatmulDesc& d = state<MatmulDesc>(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&d.trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&d.trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set(&d.a_scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set(&d.b_scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&d.epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&d.bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&d.bias_type, buf, bytes);
    default:
      return refuse("cublasLtMatmulDescSetAttribute",
                    "attribute " + std::to_string(attr) + " is not emulated (only TRANSA, TRANSB, "
                    "A_SCALE_POINTER, B_SCALE_POINTER, EPILOGUE, BIAS_POINTER, BIAS_DATA_TYPE)");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  return create(layout, Layout{type, rows, cols, ld});
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create(pref, Preference{});
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  Preference& p = state<Preference>(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&p.max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(&p.min_alignment[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(&p.min_alignment[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(&p.min_alignment[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(&p.min_alignment[3], buf, bytes);
    default:
      return refuse("cublasLtMatmulPreferenceSetAttribute",
                    "attribute " + std::to_string(attr) +
                        " is not emulated (only MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_[ABCD]_BYTES)");
  }
}

// One algorithm, needing no workspace, for every problem the matmul runs; it assumes the
// alignments the preference promised (256 bytes where it promised none, as cuBLASLt's default).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (!pref || requested <= 0 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  Problem p;
  const cublasStatus_t s = check("cublasLtMatmulAlgoGetHeuristic", handle, desc, Adesc, Bdesc,
                                 Cdesc, Ddesc, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  // The heuristic sees the leading dimensions, not the addresses: the algorithm may assume the
  // promised alignment of an operand's address, no more than its leading dimension allows.
  const Preference& promised = state<Preference>(pref);
  const uint64_t d_size = p.d.type == CUDA_R_32F ? 4 : 2;
  const uint64_t ld_bytes[4] = {uint64_t(p.a.ld), uint64_t(p.b.ld), uint64_t(p.d.ld) * d_size,
                                uint64_t(p.d.ld) * d_size};
  results[0].algo.data[0] = kAlgoTag;
  for (int i = 0; i < 4; i++) {
    const uint64_t ld_alignment = ld_bytes[i] & (~ld_bytes[i] + 1);
    results[0].algo.data[1 + i] = std::min<uint64_t>(promised.min_alignment[i], ld_alignment);
  }
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* call = "cublasLtMatmul";
  Problem p;
  if (const cublasStatus_t s = check(call, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, &p);
      s != CUBLAS_STATUS_SUCCESS)
    return s;
  // The heuristic's algorithm holds the operands' addresses to the alignments it was chosen for
  // (no algorithm given: cuBLASLt picks one for what it is given).
  if (algo && algo->data[0] == kAlgoTag) {
    const std::pair<const char*, const void*> operands[] = {{"A", A}, {"B", B}, {"C", C}, {"D", D}};
    for (int i = 0; i < 4; i++) {
      const uint64_t need = algo->data[1 + i];
      const uintptr_t at = reinterpret_cast<uintptr_t>(operands[i].second);
      if (need > 1 && at % need)
        return refuse(call, std::string("operand ") + operands[i].first + " " +
                                std::to_string(at % 256) + " bytes past a 256-byte boundary, but "
                                "the algorithm was chosen for " + std::to_string(need) +
                                "-byte alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" +
                                operands[i].first + "_BYTES, default 256)");
    }
  }
  if (C != D) return refuse(call, "C and D at different addresses: only C == D is emulated");
  if (!alpha || !beta || !valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  const MatmulDesc o = p.desc;
  const bool with_bias = o.epilogue == CUBLASLT_EPILOGUE_BIAS;
  for (const void* x : {A, B, static_cast<const void*>(D), with_bias ? o.bias : nullptr})
    if (reinterpret_cast<uintptr_t>(x) % 16)
      return refuse(call, "an operand not 16-byte aligned: FP8 needs A, B, D and bias aligned");
  // Seen on an H200 (cuBLAS 13.1): scales 4 bytes past a 16-byte boundary refused here, by the
  // call, after the heuristic (which sees no pointer) had chosen an algorithm.
  for (const void* x : {o.a_scale, o.b_scale})
    if (reinterpret_cast<uintptr_t>(x) % 16)
      return refuse(call, "a scale pointer not 16-byte aligned");
  const size_t a_bytes = extent(p.a.rows, p.a.cols, p.a.ld, 0, 1, p.a.type),
               b_bytes = extent(p.b.rows, p.b.cols, p.b.ld, 0, 1, p.b.type),
               d_bytes = extent(p.m, p.n, p.d.ld, 0, 1, p.d.type),
               a_scale_bytes = o.a_scale ? sizeof(float) : 0,
               b_scale_bytes = o.b_scale ? sizeof(float) : 0,
               bias_bytes = with_bias ? size_t(p.m) * sizeof(__nv_bfloat16) : 0;
  struct {
    const char* name;
    const void* p;
    size_t bytes;
  } operands[] = {{"A", A, a_bytes},
                  {"B", B, b_bytes},
                  {"D", D, d_bytes},
                  {"A's scale", o.a_scale, a_scale_bytes},
                  {"B's scale", o.b_scale, b_scale_bytes},
                  {"bias", o.bias, bias_bytes},
                  {"workspace", workspace, workspace_bytes}};
  for (const auto& x : operands)
    if (const std::string why = check_device_range(x.p, x.bytes); x.bytes && !why.empty()) {
      say(std::string(call) + ": operand " + x.name + " (" + std::to_string(x.bytes) +
          " bytes): " + why);
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  // alpha and beta are read now (host pointers); the scales, as the operands, when it runs.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // D as written (C read too when beta is not 0): a write is checked against both the last write
  // and the reads. The workspace is not touched: the emulated product needs none.
  std::vector<Touch> touches = {{A, a_bytes, false},
                                {B, b_bytes, false},
                                {o.a_scale, a_scale_bytes, false},
                                {o.b_scale, b_scale_bytes, false},
                                {o.bias, bias_bytes, false}};
  if (be != 0.0f) touches.push_back({C, d_bytes, false});
  touches.push_back({D, d_bytes, true});
  touch(stream, call, touches);
  const Fp8Accum mode = fp8_accumulation();
  enqueue(stream, [=] {
    const auto* a = static_cast<const uint8_t*>(A);
    const auto* b = static_cast<const uint8_t*>(B);
    const auto* bias = static_cast<const __nv_bfloat16*>(o.bias);
    const float sa = o.a_scale ? *static_cast<const float*>(o.a_scale) : 1.0f;
    const float sb = o.b_scale ? *static_cast<const float*>(o.b_scale) : 1.0f;
    const float scale = al * sa * sb;
    // Op(A)'s row i is A's column i (TN), op(B)'s column j is B's: k codes each, decoded once.
    const size_t k = size_t(p.k);
    std::vector<float> rows(size_t(p.m) * k), cols(size_t(p.n) * k);
    for (long long i = 0; i < p.m; i++)
      for (size_t q = 0; q < k; q++) rows[size_t(i) * k + q] = decode(a[q + i * p.a.ld], p.a.type);
    for (long long j = 0; j < p.n; j++)
      for (size_t q = 0; q < k; q++) cols[size_t(j) * k + q] = decode(b[q + j * p.b.ld], p.b.type);
    for (long long j = 0; j < p.n; j++)
      for (long long i = 0; i < p.m; i++) {
        const float acc = fp8_dot(&rows[size_t(i) * k], &cols[size_t(j) * k], k, mode);
        const long long at = i + j * p.d.ld;
        float v = scale * acc;
        // beta == 0 does not read C (it may hold NaN), as cuBLASLt.
        if (be != 0.0f) v += be * load(D, p.d.type, at);
        if (with_bias) v += __bfloat162float(bias[i]);
        store(D, p.d.type, at, v);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
