#pragma once
// The machines `tessera plan` plans for: per device peak FLOP/s, memory and its bandwidth, and
// the links between devices. Built-in nodes (datasheet figures), `cpu` measured on the spot, or a
// YAML machine file (input/README.md, "Machine files").
#include <string>
#include <vector>

#include "backend/peak.hpp"

namespace tessera {

struct Machine {
  std::string name;
  bool gpu = true;             // the arena in device memory (a CUDA run); false: host memory
  double peak_fp32 = 0;        // FLOP/s per device, dense
  double peak_tf32 = 0;        // (listed; tessera's fp32 GEMMs do not use TF32)
  double peak_bf16 = 0;        // 0: no bf16
  double memory = 0;           // bytes per device
  double memory_bw = 0;        // bytes/s per device
  int devices_per_node = 1;
  double intra_bw = 0;         // bytes/s per device, one direction, between devices of a node
  double inter_bw = 0;         // bytes/s per device, one direction, between nodes
  double latency = 5e-6;       // seconds per collective or message
  double reserved = 0;         // bytes the runtime takes besides the arena (context, NCCL, cuBLAS)
  double gemm_efficiency = 0.8;  // the fraction of peak the largest GEMMs reach
  double gemm_half = 64;       // a GEMM dimension of this size halves the efficiency
  // `cpu`: every GEMM timed at its own shape (backend/peak.hpp) instead of the curve above, and
  // exp-bearing ops (GELU, softmax, cross-entropy) bound by the measured exp rate too.
  bool measured = false;
  double exp_rate = 0;         // exp evaluations per second per device; 0: not a bound
  OptimizerRates optimizer{};  // `cpu`: the optimizer's passes, timed (elsewhere: bytes at memory_bw)
  double peak(bool bf16) const { return bf16 ? peak_bf16 : peak_fp32; }
};

// The built-in names, for messages and --help.
std::vector<std::string> machine_names();
// A built-in machine, or `cpu` measured now on `threads` OpenMP threads per rank (the run's
// device.threads; 0: the runtime's default), `ranks` of them sharing this node's cores and memory
// bandwidth. Throws UserError (exit 2) for an unknown name.
Machine builtin_machine(const std::string& name, int threads, long ranks);
// A YAML machine file; errors read "FILE:LINE:COL: key: problem" (UserError, exit 2).
Machine load_machine(const std::string& path);

}  // namespace tessera
