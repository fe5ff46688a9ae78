// cuBLAS and cuBLASLt loaded on their first use (dlopen), not when tessera starts: libcublasLt's
// constructors take 0.35 s of CPU in every process that links it, a CPU run never calls cuBLAS,
// and `make test` starts a thousand tessera processes. Each entry point tessera calls is defined
// here with the library's own declaration and forwards to the library's (the emulated build has
// its own, src/device/emu/cublas.cpp and cublas_lt.cpp). The libraries are found as the linker
// would have found them: the binary's run path ($(CUDA_HOME)/lib64), LD_LIBRARY_PATH, the
// loader's cache.
#ifndef TESSERA_CUDA_EMU
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

namespace {

std::string& load_error() {
  static std::string error;
  return error;
}

constexpr const char* kCublas = "libcublas";
constexpr const char* kCublasLt = "libcublasLt";

// The library `name` (kCublas, kCublasLt) of the major version tessera was compiled against
// (libcublas.so.12 from a CUDA 12 toolkit, .so.13 from CUDA 13: another major's ABI differs),
// opened on the first call into it; a failure is kept and not retried.
void* library(const char* name) {
  static std::mutex mutex;
  static std::map<std::string, void*> opened;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = opened.find(name); it != opened.end()) return it->second;
  const std::string file = std::string(name) + ".so." + std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    load_error() = "cuBLAS could not be loaded: " + std::string(dlerror()) + " (tessera was built "
                   "with CUDA " + std::to_string(CUDART_VERSION / 1000) + "'s cuBLAS " +
                   std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR) +
                   ": put that CUDA's lib64 on LD_LIBRARY_PATH, or rebuild with the node's CUDA)";
  opened[name] = h;
  return h;
}

// The library's own definition of `name` (dlsym looks in its scope only, never at ours).
template <class F>
F real(const char* lib, const char* name) {
  void* h = library(lib);
  void* f = h ? dlsym(h, name) : nullptr;
  if (h && !f) load_error() = "cuBLAS has no " + std::string(name) + ": " + dlerror();
  return reinterpret_cast<F>(f);
}

}  // namespace

// Each forwarder resolves its function in `lib` once; without the library every call fails with
// CUBLAS_STATUS_NOT_INITIALIZED, and cublasGetStatusString says why.
#define TESSERA_FORWARD(lib, name, params, args)                                \
  cublasStatus_t CUBLASWINAPI name params {                                     \
    static const auto f = real<cublasStatus_t(CUBLASWINAPI*) params>(lib, #name); \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                           \
  }

extern "C" {

TESSERA_FORWARD(kCublas, cublasCreate_v2, (cublasHandle_t* handle), (handle))
TESSERA_FORWARD(kCublas, cublasDestroy_v2, (cublasHandle_t handle), (handle))
TESSERA_FORWARD(kCublas, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream),
                (handle, stream))
TESSERA_FORWARD(kCublas, cublasSetWorkspace_v2,
                (cublasHandle_t handle, void* workspace, size_t bytes), (handle, workspace, bytes))
TESSERA_FORWARD(kCublas, cublasSetPointerMode_v2, (cublasHandle_t handle, cublasPointerMode_t mode),
                (handle, mode))
TESSERA_FORWARD(kCublas, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode),
                (handle, mode))
TESSERA_FORWARD(kCublas, cublasGemmEx,
                (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                 int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                 const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                 cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                 cublasGemmAlgo_t algo),
                (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                 Ctype, ldc, computeType, algo))
TESSERA_FORWARD(kCublas, cublasGemmStridedBatchedEx,
                (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                 int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                 long long int strideA, const void* B, cudaDataType Btype, int ldb,
                 long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                 long long int strideC, int batchCount, cublasComputeType_t computeType,
                 cublasGemmAlgo_t algo),
                (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                 strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo))

TESSERA_FORWARD(kCublas, cublasGemmGroupedBatchedEx,
                (cublasHandle_t handle, const cublasOperation_t transa_array[],
                 const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
                 const int k_array[], const void* alpha_array, const void* const Aarray[],
                 cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
                 cudaDataType_t Btype, const int ldb_array[], const void* beta_array,
                 void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
                 int group_count, const int group_size[], cublasComputeType_t computeType),
                (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array,
                 Aarray, Atype, lda_array, Barray, Btype, ldb_array, beta_array, Carray, Ctype,
                 ldc_array, group_count, group_size, computeType))

// cuBLASLt: the FP8 GEMM (backend/cuda/fp8.cu).
TESSERA_FORWARD(kCublasLt, cublasLtCreate, (cublasLtHandle_t* handle), (handle))
TESSERA_FORWARD(kCublasLt, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulDescCreate,
                (cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType,
                 cudaDataType_t scaleType),
                (desc, computeType, scaleType))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulDescSetAttribute,
                (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                 size_t sizeInBytes),
                (desc, attr, buf, sizeInBytes))
TESSERA_FORWARD(kCublasLt, cublasLtMatrixLayoutCreate,
                (cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                 int64_t ld),
                (layout, type, rows, cols, ld))
TESSERA_FORWARD(kCublasLt, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t* pref),
                (pref))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
                (pref))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulPreferenceSetAttribute,
                (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                 const void* buf, size_t sizeInBytes),
                (pref, attr, buf, sizeInBytes))
TESSERA_FORWARD(kCublasLt, cublasLtMatmulAlgoGetHeuristic,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                 cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                 cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref,
                 int requestedAlgoCount, cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                 int* returnAlgoCount),
                (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requestedAlgoCount,
                 heuristicResultsArray, returnAlgoCount))
TESSERA_FORWARD(kCublasLt, cublasLtMatmul,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                 const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                 cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                 cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                 const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
                 cudaStream_t stream),
                (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                 workspace, workspaceSizeInBytes, stream))

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static const auto f = real<decltype(&cublasGetStatusString)>(kCublas, "cublasGetStatusString");
  if (f) return f(status);
  return load_error().empty() ? "cuBLAS not loaded" : load_error().c_str();
}

}  // extern "C"

#endif  // TESSERA_CUDA_EMU
