// The CUDA emulator's cuBLAS: the handle calls and the three GEMMs the backend makes (gemm.cu), as
// a reference product with cuBLAS's column-major meaning of every argument: transposes, leading
// dimensions, batch strides, fp32 or bf16 operands, an fp32 or bf16 result, fp32 accumulation.
//
// Arguments are checked as cuBLAS checks them (m, n, k >= 0; lda >= max(1, rows of A as stored),
// likewise ldb and ldc) and answered with CUBLAS_STATUS_INVALID_VALUE; an operand whose extent
// runs outside its device allocation is CUBLAS_STATUS_EXECUTION_FAILED (an illegal address on a
// GPU), with the reason on stderr.
#include <cublas_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device/emu/blas.hpp"
#include "device/emu/memory.hpp"
#include "device/emu/races.hpp"
#include "device/emu/streams.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace tessera::emu {
namespace {

cublasStatus_t gemm(const char* call, cublasHandle_t h, cublasOperation_t ta,
                    cublasOperation_t tb, int m, int n, int k, const void* alpha, const void* A,
                    cudaDataType at, int lda, long long sa, const void* B, cudaDataType bt,
                    int ldb, long long sb, const void* beta, void* C, cudaDataType ct, int ldc,
                    long long sc, int batch, cublasComputeType_t compute) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool a_t = ta != CUBLAS_OP_N, b_t = tb != CUBLAS_OP_N;
  const int a_rows = a_t ? k : m, b_rows = b_t ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    say(std::string(call) + ": invalid value: m=" + std::to_string(m) + " n=" +
        std::to_string(n) + " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
        " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool types_ok = (at == CUDA_R_32F || at == CUDA_R_16BF) && bt == at &&
                        (ct == CUDA_R_32F || ct == at) &&
                        (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC);
  if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const int a_cols = a_t ? m : k, b_cols = b_t ? k : n;
  struct {
    const char* name;
    const void* p;
    size_t bytes;
  } operands[] = {{"A", A, k ? extent(a_rows, a_cols, lda, sa, batch, at) : 0},
                  {"B", B, k ? extent(b_rows, b_cols, ldb, sb, batch, bt) : 0},
                  {"C", C, extent(m, n, ldc, sc, batch, ct)}};
  for (const auto& o : operands)
    if (const std::string why = check_device_range(o.p, o.bytes); o.bytes && !why.empty()) {
      say(std::string(call) + ": operand " + o.name + " (" + std::to_string(o.bytes) +
          " bytes): " + why);
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  // alpha and beta are read now (host pointer mode); the product when the stream runs it.
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  // C as written: a write is checked against both the last write and the reads.
  touch(h->stream, call, {{A, operands[0].bytes, false}, {B, operands[1].bytes, false},
                          {C, operands[2].bytes, true}});
  enqueue(h->stream, [=] {
    std::vector<float> col(size_t(std::max(k, 1)));
    for (int e = 0; e < batch; e++) {
      const long long oa = e * sa, ob = e * sb, oc = e * sc;
      for (int j = 0; j < n; j++) {
        // op(B)'s column j, once per column of C.
        for (int p = 0; p < k; p++) col[size_t(p)] = load(B, bt, ob + (b_t ? j + (long long)p * ldb : p + (long long)j * ldb));
        for (int i = 0; i < m; i++) {
          float acc = 0.0f;
          for (int p = 0; p < k; p++)
            acc += load(A, at, oa + (a_t ? p + (long long)i * lda : i + (long long)p * lda)) * col[size_t(p)];
          const long long at_c = oc + i + (long long)j * ldc;
          // beta == 0 does not read C (it may hold NaN), as cuBLAS.
          store(C, ct, at_c, b == 0.0f ? a * acc : a * acc + b * load(C, ct, at_c));
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace tessera::emu

using namespace tessera::emu;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !check_device_range(workspace, bytes).empty()) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "unknown cuBLAS status";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
              ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  (void)algo;
  return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
              strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
              computeType);
}

// Each product through gemm() above, its pointers read from the device arrays. Those arrays are
// written by work queued before this call (a kernel, a copy): that work runs first, as the
// grouped kernel would read them after it in stream order. cuBLAS's table for this call has A, B
// and C of one type (fp32, or bf16 with fp32 compute): a bf16 product into fp32 C is refused.
cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  static const char* call = "cublasGemmGroupedBatchedEx";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (Ctype != Atype || Btype != Atype) return CUBLAS_STATUS_NOT_SUPPORTED;
  long long total = 0;
  for (int g = 0; g < group_count; g++) {
    if (group_size[g] < 0) return CUBLAS_STATUS_INVALID_VALUE;
    total += group_size[g];
  }
  const size_t bytes = size_t(total) * sizeof(void*);
  for (const void* arr : {static_cast<const void*>(Aarray), static_cast<const void*>(Barray),
                          static_cast<const void*>(Carray)})
    if (const std::string why = check_device_range(arr, bytes); bytes && !why.empty()) {
      say(std::string(call) + ": a pointer array (" + std::to_string(bytes) + " bytes): " + why);
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  touch(handle->stream, call, {{Aarray, bytes, false}, {Barray, bytes, false}, {Carray, bytes, false}});
  flush(handle->stream);
  const float* alpha = static_cast<const float*>(alpha_array);
  const float* beta = static_cast<const float*>(beta_array);
  long long at = 0;
  for (int g = 0; g < group_count; g++)
    for (int j = 0; j < group_size[g]; j++, at++) {
      const cublasStatus_t st =
          gemm(call, handle, transa_array[g], transb_array[g], m_array[g], n_array[g],
               k_array[g], alpha + g, Aarray[at], Atype, lda_array[g], 0, Barray[at], Btype,
               ldb_array[g], 0, beta + g, Carray[at], Ctype, ldc_array[g], 0, 1, computeType);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
