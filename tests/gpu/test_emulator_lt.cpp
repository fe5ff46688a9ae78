// The emulator's cuBLASLt (src/device/emu/cublas_lt.cpp; emulated builds only): the FP8 product
// fp8.cu asks for against a host reference computed apart (tessera's own FP8 codec, in double),
// the refusals of what cuBLASLt's FP8 kernels do not run, and the race detector seeing the
// product's operands.
#ifdef TESSERA_CUDA_EMU
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "common/fp8_format.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

// One FP8 GEMM as fp8.cu sets it up: D (m x n, ld ldd) = alpha * scale_a * scale_b * op(A) op(B)
// + beta * D (+ bias), with A stored k x m for op T, m x k for op N.
struct Gemm {
  cudaDataType a_type = CUDA_R_8F_E4M3, b_type = CUDA_R_8F_E5M2, d_type = CUDA_R_32F;
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  int64_t m = 32, n = 48, k = 64, lda = 80, ldb = 64, ldd = 48;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  const bf16* bias = nullptr;
};

// The handle, descriptors and preference of one Gemm; heuristic() and matmul() make the calls.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;

  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value),
              CUBLAS_STATUS_SUCCESS);
  }

  explicit Lt(const Gemm& g) {
    EXPECT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_TRANSA, g.ta);
    set(CUBLASLT_MATMUL_DESC_TRANSB, g.tb);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.scale_a);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.scale_b);
    if (g.bias) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_16BF));
    }
    const bool a_t = g.ta == CUBLAS_OP_T, b_t = g.tb == CUBLAS_OP_T;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&a, g.a_type, a_t ? g.k : g.m, a_t ? g.m : g.k, g.lda),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&b, g.b_type, b_t ? g.n : g.k, b_t ? g.k : g.n, g.ldb),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&d, g.d_type, g.m, g.n, g.ldd), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const uint64_t workspace = 1 << 20;
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace, sizeof workspace),
              CUBLAS_STATUS_SUCCESS);
  }
  // The alignment (bytes) of A, B, C and D the algorithm may assume, as fp8.cu promises it.
  void promise_alignment(uint32_t bytes) {
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes),
                CUBLAS_STATUS_SUCCESS);
  }
  // The heuristic's algorithm (state SUCCESS expected).
  cublasLtMatmulAlgo_t algorithm() {
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, &result, &returned),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(returned, 1);
    return result.algo;
  }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
  }

  // One algorithm and its state when the problem is supported, none otherwise.
  cublasStatus_t heuristic(cublasLtMatrixLayout_t a_layout = nullptr) {
    cublasLtMatmulHeuristicResult_t result{};
    int returned = -1;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        handle, desc, a_layout ? a_layout : a, b, d, d, pref, 1, &result, &returned);
    EXPECT_EQ(returned, s == CUBLAS_STATUS_SUCCESS ? 1 : 0);
    if (returned == 1) {
      EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
    }
    return s;
  }
  // D = ... + beta * C with C == D, as fp8.cu calls it (c: another C, to be refused).
  cublasStatus_t matmul(const void* A, const void* B, void* D, float alpha, float beta,
                        cudaStream_t stream, const void* c = nullptr,
                        const cublasLtMatmulAlgo_t* algo = nullptr) {
    return cublasLtMatmul(handle, desc, &alpha, A, a, B, b, &beta, c ? c : D, d, D, d, algo,
                          nullptr, 0, stream);
  }
};

// n FP8 codes of `f` drawn uniformly among those whose value is finite and at most 8 in
// magnitude, so that a bias of about 1 stands well above the product's fp32 rounding.
std::vector<double> random_codes(size_t n, Fp8Format f) {
  std::uniform_int_distribution<int> u(0, 255);
  std::vector<double> codes;
  while (codes.size() < n) {
    const int c = u(rng());
    const float v = fp8_decode(uint8_t(c), f);
    if (std::isfinite(v) && std::fabs(v) <= 8.0f) codes.push_back(c);
  }
  return codes;
}

// Restores an environment variable when it goes out of scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// The Gemm's product on a fresh, poisoned D of T: once with beta 0 (the poison must not be
// read), then with beta 1 and A's scale pointer re-set to another value, accumulating into what
// the first call left. Each element against the reference in double, within the bound of fp32
// accumulation over k terms (Higham's gamma_(k+3) times the sum of the magnitudes added) and,
// for a bf16 D, half a bf16 ulp; D's rows between m and ldd never written.
template <class T>
void product_and_accumulate(Gemm g) {
  constexpr bool bf16_d = std::is_same_v<T, bf16>;
  g.d_type = bf16_d ? CUDA_R_16BF : CUDA_R_32F;
  const auto a_codes = random_codes(size_t(g.lda * g.m), Fp8Format::E4M3);
  const auto b_codes = random_codes(size_t(g.ldb * g.n), Fp8Format::E5M2);
  const auto bias_values = random_of<bf16>(size_t(g.m), -2.0, 2.0);
  Dev<uint8_t> A(a_codes), B(b_codes);
  Dev<bf16> bias(bias_values);
  Dev<float> scale_a(std::vector<double>{0.5}), scale_b(std::vector<double>{3.0}),
      scale_a2(std::vector<double>{2.0});
  Dev<T> D(size_t(g.ldd * g.n));  // poisoned: NaN
  g.scale_a = scale_a, g.scale_b = scale_b, g.bias = bias;
  Lt lt(g);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  std::vector<double> before = D.fetch();
  for (const float beta : {0.0f, 1.0f}) {
    double sa = 0.5;
    if (beta != 0.0f) {
      lt.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const float*>(scale_a2));
      sa = 2.0;
    }
    ASSERT_EQ(lt.matmul(A, B, D, 1.0f, beta, device::stream()), CUBLAS_STATUS_SUCCESS);
    const std::vector<double> got = D.fetch();
    int bad = 0;
    for (int64_t j = 0; j < g.n; j++)
      for (int64_t i = 0; i < g.ldd; i++) {
        const double at = got[size_t(i + j * g.ldd)];
        if (i >= g.m) {
          if (!std::isnan(at)) bad++;
          continue;
        }
        double sum = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < g.k; p++) {
          const double x = fp8_decode(uint8_t(a_codes[size_t(p + i * g.lda)]), Fp8Format::E4M3) *
                           fp8_decode(uint8_t(b_codes[size_t(p + j * g.ldb)]), Fp8Format::E5M2);
          sum += x;
          magnitude += std::fabs(x);
        }
        const double c = beta != 0.0f ? before[size_t(i + j * g.ldd)] : 0.0;
        const double bias_i = bias_values[size_t(i)];
        const double want = sa * 3.0 * sum + c + bias_i;
        const double terms = sa * 3.0 * magnitude + std::fabs(c) + std::fabs(bias_i);
        const double fp32 = double(g.k + 3) * std::ldexp(1.0, -24) * terms;
        const double tol = fp32 + (bf16_d ? std::ldexp(std::fabs(want) + fp32, -8) : 0.0);
        if (!(std::fabs(at - want) <= tol) && bad++ < 5)
          ADD_FAILURE() << "beta " << beta << " D(" << i << ", " << j << ") = " << at << ", want "
                        << want << " within " << tol;
      }
    EXPECT_EQ(bad, 0) << "elements wrong (rows past m must stay NaN)";
    before = got;
  }
}

// With the products summed in fp32 (TESSERA_EMU_FP8_ACCUM=fp32); the default, Hopper's
// accumulation, is the next test's.
TEST(EmulatorLt, Fp8ProductMatchesTheHostReference) {
  ScopedEnv accumulation("TESSERA_EMU_FP8_ACCUM", "fp32");
  product_and_accumulate<float>(Gemm{});
  product_and_accumulate<bf16>(Gemm{});
}

// The default accumulation models Hopper's FP8 tensor cores (cublas_lt.cpp): per MMA of 32 k,
// every term cut to 13 significant bits of the MMA's largest, and the partial sum promoted to fp32
// every 128 k. One output of k = 256: each 128-k block starts with a product of 256, whose grid
// (2^-4) drops the 2^-5 products after it in that block; a block without the large product keeps
// its small ones. Block 1: 256 + 127 small, block 2: 128 small: Hopper 256 + 128 * 2^-5 = 260
// exactly (a model that never promoted would keep 256; one that promoted every MMA would keep the
// small ones of the MMAs after the first: 256 + 96 * 2^-5 + 128 * 2^-5 = 263); fp32 keeps all 255.
TEST(EmulatorLt, Fp8AccumulationModelsHopper) {
  Gemm g;
  g.a_type = CUDA_R_8F_E4M3, g.b_type = CUDA_R_8F_E5M2, g.d_type = CUDA_R_32F;
  g.m = 16, g.n = 16, g.k = 256, g.lda = 256, g.ldb = 256, g.ldd = 16;
  const auto code = [](double v, Fp8Format f) { return double(fp8_encode(float(v), f)); };
  std::vector<double> a(size_t(g.lda * g.m), code(0.125, Fp8Format::E4M3)),
      b(size_t(g.ldb * g.n), code(0.25, Fp8Format::E5M2));
  for (int64_t i = 0; i < g.m; i++) a[size_t(i * g.lda)] = code(16.0, Fp8Format::E4M3);
  for (int64_t j = 0; j < g.n; j++) b[size_t(j * g.ldb)] = code(16.0, Fp8Format::E5M2);
  Dev<uint8_t> A(a), B(b);
  Dev<float> D(size_t(g.ldd * g.n));
  Lt lt(g);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  for (const char* mode : {"hopper", "fp32"}) {
    ScopedEnv accumulation("TESSERA_EMU_FP8_ACCUM", mode);
    ASSERT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, device::stream()), CUBLAS_STATUS_SUCCESS);
    const std::vector<double> got = D.fetch();
    const double want = std::string(mode) == "hopper" ? 260.0 : 256.0 + 255.0 / 32.0;
    for (double x : got) ASSERT_EQ(x, want) << mode;
  }
}

// What cuBLASLt's FP8 kernels do not run is CUBLAS_STATUS_NOT_SUPPORTED from the heuristic and
// the matmul alike; layouts that do not fit together are INVALID_VALUE; an operand past its
// allocation is EXECUTION_FAILED.
TEST(EmulatorLt, RefusesWhatFp8KernelsDoNotRun) {
  Dev<uint8_t> A(80 * 80), B(80 * 80);
  Dev<float> D(80 * 80), other_c(80 * 80);
  auto refused = [&](const Gemm& g, const char* what) {
    Lt lt(g);
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED) << what;
    EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, device::stream()), CUBLAS_STATUS_NOT_SUPPORTED)
        << what;
  };
  Gemm nn;
  nn.ta = CUBLAS_OP_N, nn.lda = 32;  // A stored m x k
  refused(nn, "NN");
  Gemm e5m2;
  e5m2.a_type = CUDA_R_8F_E5M2;
  refused(e5m2, "A and B both E5M2");
  Gemm k24;
  k24.k = 24, k24.lda = 32, k24.ldb = 32;
  refused(k24, "k = 24");
  Gemm half;
  half.d_type = CUDA_R_16F;
  refused(half, "an fp16 D");
  {
    ScopedEnv cc("TESSERA_EMU_COMPUTE", "8.0");
    testing::internal::CaptureStderr();
    refused(Gemm{}, "compute capability 8.0");
    EXPECT_NE(testing::internal::GetCapturedStderr().find(
                  "cublasLtMatmul: not supported: compute capability 8.0"),
              std::string::npos);
  }
  for (const char* cc : {"8.9", "9.0"}) {
    ScopedEnv env("TESSERA_EMU_COMPUTE", cc);
    Lt lt(Gemm{});
    EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS) << cc;
  }
  Lt lt(Gemm{});
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);  // the default: the emulator, allowed
  EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, device::stream(), other_c), CUBLAS_STATUS_NOT_SUPPORTED)
      << "C != D";
  // An attribute fp8.cu does not set, and one of the wrong size.
  const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode,
                                           sizeof mode),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const uint32_t search = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE,
                                                 &search, sizeof search),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const int8_t small = 0;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &small, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  // A laid out m x k although op(A) = T wants k x m.
  cublasLtMatrixLayout_t wrong = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&wrong, CUDA_R_8F_E4M3, 32, 64, 32), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.heuristic(wrong), CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayoutDestroy(wrong);
  // A (k x m, lda 80) spans 31 * 80 + 64 bytes: from a buffer of 64 * 32 it runs out.
  Dev<uint8_t> short_a(64 * 32);
  EXPECT_EQ(lt.matmul(short_a, B, D, 1.0f, 0.0f, device::stream()),
            CUBLAS_STATUS_EXECUTION_FAILED);
  sync();
}

// The heuristic's algorithm assumes the alignment the preference promised (256 bytes by default,
// as cuBLASLt's), as far as the leading dimensions allow; the matmul refuses an operand whose
// address falls short of it. Operands 16 bytes past a 256-byte boundary, leading dimensions of
// 256 bytes: refused by the default promise, run under a promise of 16.
TEST(EmulatorLt, AnAlgorithmHoldsOperandsToItsAlignment) {
  Gemm g;
  g.lda = 256, g.ldb = 256, g.ldd = 64;  // A and B 256 bytes a column, D 64 floats
  Dev<uint8_t> A(random_codes(size_t(g.lda * g.m), Fp8Format::E4M3), 16);
  Dev<uint8_t> B(random_codes(size_t(g.ldb * g.n), Fp8Format::E5M2));
  Dev<float> D(size_t(g.ldd * g.n));
  {
    Lt lt(g);
    const cublasLtMatmulAlgo_t algo = lt.algorithm();
    testing::internal::CaptureStderr();
    EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, device::stream(), nullptr, &algo),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_NE(testing::internal::GetCapturedStderr().find(
                  "operand A 16 bytes past a 256-byte boundary, but the algorithm was chosen for "
                  "256-byte alignment"),
              std::string::npos);
    // B and D are aligned: only A's promise matters.
    EXPECT_EQ(lt.matmul(B, B, D, 1.0f, 0.0f, device::stream(), nullptr, &algo),
              CUBLAS_STATUS_SUCCESS);
  }
  Lt lt(g);
  lt.promise_alignment(16);
  const cublasLtMatmulAlgo_t algo = lt.algorithm();
  EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, device::stream(), nullptr, &algo),
            CUBLAS_STATUS_SUCCESS);
  sync();
}

bool races_on() {
  const char* v = std::getenv("TESSERA_EMU_RACES");
  return !v || std::string(v).rfind("on", 0) == 0;
}

__global__ void fill_kernel(float* x, float v) { x[threadIdx.x] = v; }

// cublasLtMatmul on the compute stream reading what a copy, then a kernel, on another stream
// wrote (A's codes, B's scale) without an event between them ends the run; with it, it does not.
TEST(EmulatorStreams, RacesOnCublasLtOperandsAreFound) {
  if (!races_on()) GTEST_SKIP() << "TESSERA_EMU_RACES=off";
  cudaStream_t other = nullptr;
  cudaEvent_t done = nullptr;
  ck(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "stream");
  ck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event");
  const Gemm shape;
  const size_t a_bytes = size_t(shape.lda * shape.m);
  Dev<uint8_t> A(random_codes(a_bytes, Fp8Format::E4M3));
  Dev<uint8_t> source(random_codes(a_bytes, Fp8Format::E4M3));
  Dev<uint8_t> B(random_codes(size_t(shape.ldb * shape.n), Fp8Format::E5M2));
  Dev<float> D(size_t(shape.ldd * shape.n)), scale_a(std::vector<double>{1.0}),
      scale_b(std::vector<double>{1.0});
  Gemm g;
  g.scale_a = scale_a, g.scale_b = scale_b;
  Lt lt(g);
  const cudaStream_t compute = device::stream();
  ck(cudaMemcpyAsync(A.get(), source.get(), a_bytes, cudaMemcpyDeviceToDevice, other), "copy");
  EXPECT_DEATH(lt.matmul(A, B, D, 1.0f, 0.0f, compute),
               "race on memory at 0x[0-9a-f]+: cublasLtMatmul on stream \"compute\" reads what "
               "cudaMemcpyAsync on stream \"stream [0-9]+\" wrote, with no event between them");
  ck(cudaEventRecord(done, other), "record");
  ck(cudaStreamWaitEvent(compute, done, 0), "wait");
  EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, compute), CUBLAS_STATUS_SUCCESS);
  sync();  // else the kernel below would overwrite the scale this matmul read: a race too
  cuda::launch<fill_kernel>(1, 1, 0, other, scale_b.get(), 2.0f);
  EXPECT_DEATH(lt.matmul(A, B, D, 1.0f, 0.0f, compute),
               "cublasLtMatmul on stream \"compute\" reads what fill_kernel on stream \"stream "
               "[0-9]+\" wrote");
  ck(cudaStreamSynchronize(other), "sync");  // the host has seen the kernel done
  EXPECT_EQ(lt.matmul(A, B, D, 1.0f, 0.0f, compute), CUBLAS_STATUS_SUCCESS);
  sync();
  cudaEventDestroy(done);
  cudaStreamDestroy(other);
}

}  // namespace
}  // namespace tessera::gpu_test
#endif
