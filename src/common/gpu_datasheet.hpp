#pragma once
// The dense (no sparsity) peak FLOP/s of the GPUs tessera knows, from their datasheets: the one
// table a run's MFU (backend/cuda, by the device's compute capability and name) and the
// planner's built-in machines (plan/machine.cpp) both read.
//   A100 (sm_80, SXM):   FP32 19.5, TF32 156, BF16 312 TFLOP/s; no FP8
//   H100 SXM, H200, GH200 (sm_90): FP32 67, TF32 494.5, BF16 989.5, FP8 1979 ("with sparsity"
//                        figures halved: 989 and 3958 rounded)
//   H100 PCIe (sm_90, "PCIe" in the name): FP32 51, TF32 378, BF16 756, FP8 1513
namespace tessera {

struct GpuPeaks {
  double fp32 = 0, tf32 = 0, bf16 = 0, fp8 = 0;  // FLOP/s; 0: unknown, or none (A100's FP8)
};

// The GPU of compute capability major.minor; pcie: its name says PCIe. Zeros for one not known.
GpuPeaks datasheet_peaks(int major, int minor, bool pcie);

}  // namespace tessera
