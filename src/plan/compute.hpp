#pragma once
// The device's speed at a step's own shapes, for `tessera plan` on a GPU (docs/planning.md):
// a GEMM takes the longer of its FLOPs at the peak times an efficiency and its operands'
// bytes at the memory bandwidth (a roofline on its arithmetic intensity), its rows and columns
// rounded up to whole tiles first (tile quantization), the efficiency lower the shorter its
// smallest dimension (gemm_half); memory-bound ops stream at a fraction of the bandwidth; every
// kernel launch costs a fixed time. The constants are the machine's
// (plan/machine.hpp), each named with its source there; `cpu` times its GEMMs instead.
namespace tessera {

struct ComputeModel {
  double peak = 0;               // FLOP/s at the step's precision
  double gemm_efficiency = 1;    // the fraction of peak a large, tile-aligned GEMM reaches
  double gemm_half = 0;          // optional: the smallest dimension d scales that by
                                 // d / (d + gemm_half)
  double gemm_tile = 0;          // M and N rounded up to multiples of this (0: not rounded)
  double memory_bw = 0;          // bytes/s
  double memory_efficiency = 1;  // the fraction of memory_bw streaming ops reach
  double element_bytes = 2;      // a GEMM operand's element
};

// One product C(M,N) = A(M,K) B(K,N).
double gemm_seconds(const ComputeModel& c, double M, double N, double K);
// A memory-bound op moving `bytes`.
double stream_seconds(const ComputeModel& c, double bytes);

}  // namespace tessera
