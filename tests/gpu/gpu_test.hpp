#pragma once
// Shared by the GPU tests and the GPU bench: device buffers that upload and download with
// conversion, fresh random inputs, and the comparison against the CPU op.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "device/context.hpp"
#include "backend/cuda/ops.hpp"

namespace tessera::gpu_test {

using bf16 = __nv_bfloat16;

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void sync() { ck(cudaStreamSynchronize(device::stream()), "cudaStreamSynchronize"); }

// Conversions on the host (cuda_bf16.h's are host-callable); rounding to nearest even.
template <typename T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16_rn(float(x));
  else return T(x);
}
template <typename T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, bf16>) return double(__bfloat162float(x));
  else return double(x);
}
// x rounded to what a T holds, as a double: the CPU reference reads exactly the device's inputs.
template <typename T>
double round_to(double x) {
  return to_double(from_double<T>(x));
}

// The generator of one run; its seed is printed at start so a failure can be replayed
// (TESSERA_GPU_TEST_SEED=...).
std::mt19937_64& rng();
uint64_t seed();

// The names gtest gives the typed suites over float and bf16 (TYPED_TEST_SUITE's third argument).
struct TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};

// n values uniform in [lo, hi), each representable in T.
template <typename T>
std::vector<double> random_of(size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = round_to<T>(u(rng()));
  return v;
}

// n elements of T on the device, `offset` elements past a cudaMalloc'd (256-byte aligned) base,
// so offset 1 gives a pointer that is not 16-byte aligned (the ops' scalar paths). Starts
// poisoned: every byte 0xFF is a NaN in fp32, fp64 and bf16, so an element an op should have
// written but did not shows up as NaN.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n, size_t offset = 0) : n_(n) {
    ck(cudaMalloc(&base_, (n + offset) * sizeof(T) + 16), "cudaMalloc");
    p_ = static_cast<T*>(base_) + offset;
    poison();
  }
  Dev(const std::vector<double>& host, size_t offset = 0) : Dev(host.size(), offset) { put(host); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(base_); }

  T* get() const { return p_; }
  operator T*() const { return p_; }
  size_t size() const { return n_; }

  void poison() {
    ck(cudaMemsetAsync(p_, 0xFF, n_ * sizeof(T), device::stream()), "cudaMemsetAsync");
    sync();
  }
  void put(const std::vector<double>& host) {
    std::vector<T> t(n_);
    for (size_t i = 0; i < n_; i++) t[i] = from_double<T>(host.at(i));
    ck(cudaMemcpyAsync(p_, t.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, device::stream()),
       "cudaMemcpyAsync H2D");
    sync();  // t goes out of scope
  }
  std::vector<double> fetch() const {
    sync();  // the ops run on device::stream(); wait for them first
    std::vector<T> t(n_);
    ck(cudaMemcpyAsync(t.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, device::stream()),
       "cudaMemcpyAsync D2H");
    sync();
    std::vector<double> out(n_);
    for (size_t i = 0; i < n_; i++) out[i] = to_double(t[i]);
    return out;
  }

 private:
  void* base_ = nullptr;
  T* p_ = nullptr;
  size_t n_;
};

// Integer buffers (tokens, targets) need no conversion.
class DevInts {
 public:
  explicit DevInts(const std::vector<int32_t>& host) : n_(host.size()) {
    ck(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(int32_t) + 16), "cudaMalloc");
    ck(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                       device::stream()),
       "cudaMemcpyAsync H2D");
    sync();
  }
  DevInts(const DevInts&) = delete;
  DevInts& operator=(const DevInts&) = delete;
  ~DevInts() { cudaFree(p_); }
  operator const int32_t*() const { return p_; }

 private:
  int32_t* p_ = nullptr;
  size_t n_;
};

// The error measure of every comparison: max |got - want| / max |want| over the compared
// elements (relative to the tensor's scale, so near-zero elements do not dominate). Any
// non-finite `got` fails outright: a surviving poison NaN is an element the op did not write.
// Where every `got` is a bf16 value (a bf16 output), also its error in units in the last place of
// the reference rounded to nearest even: the signed mean (positive: away from zero), which a
// store that truncates instead of rounding moves by about half an ulp while max |got - want|
// hardly sees it, and the largest.
struct Compare {
  double rel = 0.0;
  size_t worst = 0;
  std::string problem;  // "" when every element is finite
  bool bf16_values = false;
  double bias_ulps = 0.0, max_ulps = 0.0;
};
// `terms` (element-wise ops that add): each element's sum of the magnitudes it was computed
// from; where the result cancelled to below 2^-12 of them, fp32's own rounding of the terms
// (a few of its ulps) exceeds half a bf16 ulp of the result, so the ulp measures skip it.
Compare compare(const std::vector<double>& got, const std::vector<double>& want,
                const std::vector<double>* terms = nullptr);

// v with every element rounded to what an F holds (a reference's output handed to the next op).
template <typename F>
std::vector<double> rounded(std::vector<double> v) {
  for (double& x : v) x = round_to<F>(x);
  return v;
}

template <typename F>
constexpr double tolerance() {
  return std::is_same_v<F, float> ? 1e-5 : 2e-2;
}

}  // namespace tessera::gpu_test

// In a gtest file (names of tessera::gpu_test in scope): got within tol of want by compare()'s
// measure, every element finite, and a bf16 output unbiased: the signed mean of its errors
// against the reference rounded to nearest even stays within 0.1 ulp (a store that truncates
// gives about -0.5).
#define EXPECT_CLOSE(got, want, tol, what)                                                       \
  do {                                                                                           \
    const Compare c_ = compare(got, want);                                                       \
    EXPECT_TRUE(c_.problem.empty()) << (what) << ": " << c_.problem;                             \
    EXPECT_LE(c_.rel, (tol)) << (what) << ": worst element " << c_.worst << " got "            \
                             << (got)[c_.worst] << " want " << (want)[c_.worst];               \
    EXPECT_LE(c_.bf16_values ? std::fabs(c_.bias_ulps) : 0.0, 0.1)                               \
        << (what) << ": bf16 results biased by " << c_.bias_ulps                                 \
        << " ulp against the reference rounded to nearest even";                                 \
  } while (0)

