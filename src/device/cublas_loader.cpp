// cuBLAS loaded on its first use (dlopen), not when tessera starts: libcublasLt's constructors
// take 0.35 s of CPU in every process that links it, a CPU run never calls cuBLAS, and `make test`
// starts a thousand tessera processes. Each entry point tessera calls is defined here with
// cuBLAS's own declaration and forwards to the library's (the emulated build has its own,
// src/device/emu/cublas.cpp). The library is found as the linker would have found it: the
// binary's run path ($(CUDA_HOME)/lib64), LD_LIBRARY_PATH, the loader's cache.
#ifndef TESSERA_CUDA_EMU
#include <cublas_api.h>
#include <dlfcn.h>

#include <string>

namespace {

std::string& load_error() {
  static std::string error;
  return error;
}

void* library() {
  static void* handle = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) load_error() = "cuBLAS could not be loaded: " + std::string(dlerror());
    return h;
  }();
  return handle;
}

// The library's own definition of `name` (dlsym looks in its scope only, never at ours).
template <class F>
F real(const char* name) {
  void* h = library();
  void* f = h ? dlsym(h, name) : nullptr;
  if (h && !f) load_error() = "cuBLAS has no " + std::string(name) + ": " + dlerror();
  return reinterpret_cast<F>(f);
}

}  // namespace

// Each forwarder resolves its function once; without the library every call fails with
// CUBLAS_STATUS_NOT_INITIALIZED, and cublasGetStatusString says why.
#define TESSERA_FORWARD(name, params, args)                                \
  cublasStatus_t CUBLASWINAPI name params {                               \
    static const auto f = real<cublasStatus_t(CUBLASWINAPI*) params>(#name); \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                     \
  }

extern "C" {

TESSERA_FORWARD(cublasCreate_v2, (cublasHandle_t* handle), (handle))
TESSERA_FORWARD(cublasDestroy_v2, (cublasHandle_t handle), (handle))
TESSERA_FORWARD(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
TESSERA_FORWARD(cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t bytes),
                (handle, workspace, bytes))
TESSERA_FORWARD(cublasSetPointerMode_v2, (cublasHandle_t handle, cublasPointerMode_t mode),
                (handle, mode))
TESSERA_FORWARD(cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
TESSERA_FORWARD(cublasGemmEx,
                (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                 int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                 const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                 cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                 cublasGemmAlgo_t algo),
                (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                 Ctype, ldc, computeType, algo))
TESSERA_FORWARD(cublasGemmStridedBatchedEx,
                (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                 int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                 long long int strideA, const void* B, cudaDataType Btype, int ldb,
                 long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                 long long int strideC, int batchCount, cublasComputeType_t computeType,
                 cublasGemmAlgo_t algo),
                (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                 strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo))

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static const auto f = real<decltype(&cublasGetStatusString)>("cublasGetStatusString");
  if (f) return f(status);
  return load_error().empty() ? "cuBLAS not loaded" : load_error().c_str();
}

}  // extern "C"

#endif  // TESSERA_CUDA_EMU
