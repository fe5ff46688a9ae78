#pragma once
// The machines `tessera plan` plans for: per device peak FLOP/s, memory and its bandwidth, and
// the links between devices. Built-in nodes (datasheet figures), `cpu` measured on the spot, or a
// YAML machine file (input/README.md, "Machine files").
#include <string>
#include <vector>

#include "backend/peak.hpp"
#include "plan/compute.hpp"
#include "plan/network.hpp"

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
  double inter_bw = 0;         // bytes/s per NIC, one direction, between nodes
  double latency = 5e-6;       // seconds per step of a collective or message between nodes
  double reserved = 0;         // bytes the runtime takes besides the arena (context, NCCL, cuBLAS)
  // The compute model's constants (plan/compute.hpp; each built-in one's source in machine.cpp):
  double gemm_efficiency = 0.8;  // the fraction of peak a large, tile-aligned GEMM reaches
  double gemm_half = 0;        // optional: a GEMM whose smallest dimension is this halves it
  double gemm_tile = 128;      // GEMM rows and columns rounded up to this
  double memory_efficiency = 0.7;  // the fraction of memory_bw streaming ops reach
  double kernel_overhead = 5e-6;   // seconds per kernel launch (launch gap, framework)
  // `cpu`: every GEMM timed at its own shape (backend/peak.hpp) instead of the curve above, and
  // exp-bearing ops (GELU, softmax, cross-entropy) bound by the measured exp rate too.
  bool measured = false;
  double exp_rate = 0;         // exp evaluations per second per device; 0: not a bound
  OptimizerRates optimizer{};  // `cpu`: the optimizer's passes, timed (elsewhere: bytes at memory_bw)
  int nics_per_node = 0;       // NICs per node (0: one per device)
  double intra_latency = 1e-6; // seconds per step of a collective or message inside a node
  double peak_fp8 = 0;         // dense FP8 FLOP/s per device; 0: no FP8 (before sm_89: A100)
  double peak(bool bf16) const { return bf16 ? peak_bf16 : peak_fp32; }
  ComputeModel compute(bool bf16) const {
    return {peak(bf16), gemm_efficiency, gemm_half, gemm_tile, memory_bw, memory_efficiency,
            bf16 ? 2.0 : 4.0};
  }
  // device.precision fp8's GEMMs: one-byte operands at the FP8 peak.
  ComputeModel compute_fp8() const {
    ComputeModel m = compute(true);
    m.peak = peak_fp8;
    m.element_bytes = 1;
    return m;
  }
  // The two tiers collectives are priced on (plan/network.hpp).
  Network network() const {
    return {devices_per_node, nics_per_node > 0 ? nics_per_node : devices_per_node, inter_bw,
            intra_bw, latency, intra_latency};
  }
};

// The built-in names, for messages and --help.
std::vector<std::string> machine_names();
// A built-in machine, or `cpu` measured now on `threads` OpenMP threads per rank (the run's
// device.threads; 0: the runtime's default), `ranks` of them sharing this node's cores and memory
// bandwidth. Throws UserError (exit 2) for an unknown name.
Machine builtin_machine(const std::string& name, int threads, long ranks);
// A YAML machine file, read by the deck's rules (config/yaml_map.hpp): errors read
// "FILE:LINE:COL: key: problem" (UserError, exit 2), every number within its range, a key given
// twice refused. Only a regular file is opened: a FIFO, a directory or a device is named as such
// (exit 2), a missing or unreadable file is exit 1, as for a deck.
Machine load_machine(const std::string& path);
// The same from the file's text (tests/fuzz's `machine` target); `origin` names it in messages.
Machine parse_machine(const std::string& text, const std::string& origin);

}  // namespace tessera
