// src/device/cublas_loader.cpp: cuBLAS is not linked but loaded on first use. Without a GPU the
// library still loads and answers: its own status strings come back through the forwarders, and
// creating a handle fails with a status, not a crash.
#if defined(TESSERA_CUDA) && !defined(TESSERA_CUDA_EMU)
#include <cublas_api.h>
#include <gtest/gtest.h>

#include <cstring>

TEST(CublasLoader, TheLibrarysOwnAnswersComeThrough) {
  const char* ok = cublasGetStatusString(CUBLAS_STATUS_SUCCESS);
  ASSERT_NE(ok, nullptr);
  // cuBLAS's text, not the loader's "could not be loaded".
  EXPECT_EQ(std::strstr(ok, "could not be loaded"), nullptr) << ok;
  EXPECT_STRNE(ok, cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));
  cublasHandle_t handle = nullptr;
  const cublasStatus_t st = cublasCreate_v2(&handle);
  if (st == CUBLAS_STATUS_SUCCESS) {  // a machine with a GPU
    EXPECT_EQ(cublasDestroy_v2(handle), CUBLAS_STATUS_SUCCESS);
  } else {  // none: cuBLAS's own reason, e.g. "the library was not initialized"
    EXPECT_EQ(std::strstr(cublasGetStatusString(st), "could not be loaded"), nullptr);
  }
}
#endif
