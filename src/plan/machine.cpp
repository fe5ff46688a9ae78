#include "plan/machine.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "backend/peak.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "common/gpu_datasheet.hpp"
#include "common/limits.hpp"
#include "config/yaml_map.hpp"

namespace tessera {

namespace {

constexpr double kGB = 1e9, kGiB = 1024.0 * 1024 * 1024, kT = 1e12;

// Peaks: the dense datasheet table of common/gpu_datasheet.hpp; bandwidths one direction (NVLink's
// datasheet figure is per GPU, both directions together, halved here; inter-node: per NIC, one NIC
// per GPU in every node built in). Latencies: 5 us a step between nodes (an InfiniBand message), 1 us
// inside a node (NVLink); NCCL's own tuner (src/graph/tuning.cc) charges steps of that order.
// The compute model's constants (plan/compute.hpp), one set per GPU and power class, fitted once
// by tools/reference/plan_fit.py against the published runs of tools/reference/plan_published.py
// held to the model (docs/planning.md), the same for every row: the efficiency of a large
// tile-aligned bf16 GEMM, its shape dependence (a GEMM whose smallest dimension is d runs at
// d / (d + gemm_half) of it: attention's head-size products and narrow layers' GEMMs are
// slower), and a kernel launch's fixed cost. The grid's best over A100's 14 rows (Narayanan et
// al. 2021, Korthikanti et al. 2022, torchtitan): 0.86, 256, 5 us, 0.91-1.10 of published. The
// H100 by power class, the shape and launch cost held at A100's: at 700 W (NVIDIA's DGX H100
// recipes, NeMo on Megatron-Core: 4 rows, 0.98-1.03) 0.87; capped at 500 W (torchtitan's two
// rows, eager PyTorch) 0.48 (0.98-1.00). Stated, not fitted: the tile (cuBLAS's and CUTLASS's
// bf16 thread-block tiles are 128 or 256 wide: 128), and 0.7 of the HBM bandwidth for
// elementwise and normalisation kernels (unfused PyTorch/Megatron ops; STREAM-like copies reach
// 0.85-0.9 on both GPUs).
struct ComputeConstants {
  double gemm_efficiency, gemm_half, gemm_tile, memory_efficiency, kernel_us;
};
constexpr ComputeConstants kA100{0.86, 256, 128, 0.70, 5};
constexpr ComputeConstants kH100Full{0.87, 256, 128, 0.70, 5};
constexpr ComputeConstants kH100Capped{0.48, 256, 128, 0.70, 5};
void compute_constants(Machine& m, const ComputeConstants& k) {
  m.gemm_efficiency = k.gemm_efficiency;
  m.gemm_half = k.gemm_half;
  m.gemm_tile = k.gemm_tile;
  m.memory_efficiency = k.memory_efficiency;
  m.kernel_overhead = k.kernel_us * 1e-6;
}

std::vector<Machine> builtins() {
  std::vector<Machine> m;
  // NVIDIA A100 Tensor Core GPU datasheet (SXM): FP32 19.5, TF32 156, BF16 312 TFLOP/s; 40 GB
  // HBM2 at 1,555 GB/s, 80 GB HBM2e at 2,039 GB/s; NVLink 600 GB/s. DGX A100: 8 GPUs, one
  // 200 Gb/s HDR InfiniBand port per GPU.
  const GpuPeaks a100 = datasheet_peaks(8, 0, false), hopper = datasheet_peaks(9, 0, false);
  Machine a40{"a100-40gb", true, a100.fp32, a100.tf32, a100.bf16, 40 * kGiB, 1555 * kGB, 8,
              300 * kGB, 25 * kGB, 5e-6, 2 * kGiB};
  compute_constants(a40, kA100);
  Machine a80 = a40;
  a80.name = "a100-80gb";
  a80.memory = 80 * kGiB;
  a80.memory_bw = 2039 * kGB;
  // NVIDIA H100 Tensor Core GPU datasheet (SXM): FP32 67, TF32 494.5, BF16 989.5 TFLOP/s
  // (989 "with sparsity" halved); 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s. DGX H100: 8 GPUs,
  // one 400 Gb/s NDR port per GPU. Its "Max TDP up to 700W (configurable)": a DGX H100 runs at
  // 700 W; sites cap it lower (torchtitan's published H100s at 500 W), same datasheet, slower
  // GEMMs. `h100-sxm` is the datasheet part as shipped: the 700 W class.
  Machine h100{"h100-sxm-700w", true, hopper.fp32, hopper.tf32, hopper.bf16, 80 * kGiB,
               3350 * kGB, 8, 450 * kGB, 50 * kGB, 5e-6, 2 * kGiB};
  compute_constants(h100, kH100Full);
  // FP8 (E4M3/E5M2) Tensor Core: 3,958 TFLOP/s "with sparsity", 1,979 dense; the H200 and GH200
  // below have the H100's. The A100 has none (FP8 needs sm_89 or later).
  h100.peak_fp8 = hopper.fp8;
  Machine h100_capped = h100;
  h100_capped.name = "h100-sxm-500w";
  compute_constants(h100_capped, kH100Capped);
  Machine h100_datasheet = h100;
  h100_datasheet.name = "h100-sxm";
  // The H200 (up to 700 W) and GH200 below take the full-power class's constants: no published
  // row of either is held to the model yet.
  // NVIDIA H200 datasheet (SXM): the H100's compute; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s.
  Machine h200 = h100;
  h200.name = "h200";
  h200.memory = 141 * kGB;
  h200.memory_bw = 4800 * kGB;
  // NVIDIA GH200 Grace Hopper Superchip datasheet: the H100's compute; 96 GB HBM3 at 4 TB/s.
  // Four superchips per node (HPE Cray EX254n, as in Alps), linked GPU to GPU by NVLink
  // (150 GB/s one direction per pair: a reading of the node's diagram, not a datasheet line), and
  // one 200 Gb/s Slingshot NIC each.
  Machine gh200 = h100;
  gh200.name = "gh200";
  gh200.memory = 96 * kGiB;
  gh200.memory_bw = 4000 * kGB;
  gh200.devices_per_node = 4;
  gh200.intra_bw = 150 * kGB;
  gh200.inter_bw = 25 * kGB;
  return {a40, a80, h100, h100_capped, h100_datasheet, h200, gh200};
}

// This machine, measured now, as the run would use it: one device is `threads` OpenMP threads
// (the run's), the node's cores shared among as many such devices as fit, and the memory
// bandwidth among the ranks running at once. GEMMs are timed at the step's own shapes when the
// plan asks (Machine::measured); the sgemm cube is the peak MFU is stated against. MPI's
// shared-memory transfers copy at the measured bandwidth twice (into and out of the segment).
Machine measured_cpu(int threads, long ranks) {
  if (threads > 0) omp_set_num_threads(threads);
  threads = std::max(1, omp_get_max_threads());
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  Machine m;
  m.name = "cpu";
  m.gpu = false;
  m.measured = true;
  m.peak_fp32 = measure_sgemm_gflops(0.3) * 1e9;
  m.exp_rate = measure_exp_rate(0.05);
  m.devices_per_node = std::max(1, cores / threads);
  // Ranks beside this one on the node draw on the same memory: the whole node's bandwidth
  // (every core copying) split among them, or one rank's threads' own, whichever is less.
  const double own = measure_copy_bandwidth(0.1);
  omp_set_num_threads(cores);
  const double node = measure_copy_bandwidth(0.1);
  omp_set_num_threads(threads);
  const long sharing = std::clamp<long>(ranks, 1, m.devices_per_node);
  m.memory_bw = std::min(own, node / double(sharing));
  m.optimizer = measure_optimizer_rates(int(sharing));
  m.memory = 0;  // the host's: checked against what the node has (trainer.cpp's node check)
  m.intra_bw = m.inter_bw = m.memory_bw / 4;
  m.latency = m.intra_latency = 20e-6;
  // Its GEMMs and streams are timed (Machine::measured): no model constants on top.
  m.memory_efficiency = 1;
  m.kernel_overhead = 0;
  return m;
}

}  // namespace

std::vector<std::string> machine_names() {
  std::vector<std::string> names;
  for (const Machine& m : builtins()) names.push_back(m.name);
  names.push_back("cpu");
  return names;
}

Machine builtin_machine(const std::string& name, int threads, long ranks) {
  if (name == "cpu") return measured_cpu(threads, ranks);
  for (const Machine& m : builtins())
    if (m.name == name) return m;
  std::string known;
  for (const std::string& n : machine_names()) known += (known.empty() ? "" : ", ") + n;
  throw UserError("--machine " + name + ": no such machine (built in: " + known +
                  "; or --machine-file FILE)");
}

Machine parse_machine(const std::string& text, const std::string& origin) {
  Machine m;
  m.name = origin;
  m.reserved = 2 * kGiB;
  // Each number's range, with why it ends there: far beyond any device built, and near enough
  // that no plan's arithmetic leaves the doubles (a tile or half-width of 1e300 made a NaN plan).
  struct Key {
    const char* name;
    double scale;  // to SI units
    double* value;
    bool required;
    double low, high;
    const char* why;  // of high
  };
  constexpr double kMost = 1e6;  // TFLOP/s, GB, GB/s, microseconds
  constexpr const char* kMostWhy = "over a hundred times any device's";
  const Key keys[] = {
      {"peak_tflops_fp32", kT, &m.peak_fp32, true, 1e-6, kMost, kMostWhy},
      {"peak_tflops_tf32", kT, &m.peak_tf32, false, 0, kMost, kMostWhy},
      {"peak_tflops_bf16", kT, &m.peak_bf16, false, 0, kMost, kMostWhy},
      {"peak_tflops_fp8", kT, &m.peak_fp8, false, 0, kMost, kMostWhy},
      {"memory_gb", kGB, &m.memory, true, 1e-3, kMost, kMostWhy},
      {"memory_bandwidth_gbs", kGB, &m.memory_bw, true, 1e-3, kMost, kMostWhy},
      {"intra_node_gbs", kGB, &m.intra_bw, true, 1e-3, kMost, kMostWhy},
      {"inter_node_gbs", kGB, &m.inter_bw, true, 1e-3, kMost, kMostWhy},
      {"latency_us", 1e-6, &m.latency, false, 0, kMost, "a second a step"},
      {"intra_latency_us", 1e-6, &m.intra_latency, false, 0, kMost, "a second a step"},
      {"reserved_gb", kGB, &m.reserved, false, 0, kMost, kMostWhy},
      {"gemm_efficiency", 1, &m.gemm_efficiency, false, 1e-3, 1, "a fraction of the peak"},
      {"gemm_half", 1, &m.gemm_half, false, 0, kMost,
       "over ten times a published model's widest GEMM dimension, 53248"},
      {"gemm_tile", 1, &m.gemm_tile, false, 0, 4096, "GEMM kernels' tiles are 64 to 256 wide"},
      {"memory_efficiency", 1, &m.memory_efficiency, false, 1e-3, 1, "a fraction of the bandwidth"},
      {"kernel_us", 1e-6, &m.kernel_overhead, false, 0, kMost, "a second a launch"},
  };
  // Whole numbers, as the deck's integers: decimal digits only (3e9 and 1.5 are refused).
  constexpr int kMostDevices = 1 << 20;  // tessera plan's largest --ranks
  bool per_node = false;
  std::vector<YamlEntry> entries = read_yaml_map(text, origin, "a machine file");
  for (const YamlEntry& e : entries) {
    if (e.key == "name") {
      m.name = yaml_string(e);
      // A plan's first line and its messages show the name: one line of text.
      if (m.name.empty() || std::any_of(m.name.begin(), m.name.end(), [](char c) {
            return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
          }))
        throw UserError(e.where + ": expected one line of text, got " + yaml_shown(m.name));
    } else if (e.key == "gpu") {
      m.gpu = yaml_bool(e);
    } else if (e.key == "gpus_per_node" || e.key == "nics_per_node") {
      const int n = yaml_int(e);
      if (n < 1) throw UserError(e.where + ": must be >= 1, got " + std::to_string(n));
      if (n > kMostDevices)
        throw UserError(e.where + ": must be <= " + std::to_string(kMostDevices) +
                        " (the most ranks tessera plan takes), got " + std::to_string(n));
      (e.key == "gpus_per_node" ? m.devices_per_node : m.nics_per_node) = n;
      per_node = per_node || e.key == "gpus_per_node";
    } else {
      const Key* k = nullptr;
      for (const Key& candidate : keys)
        if (e.key == candidate.name) k = &candidate;
      if (!k)
        throw UserError(e.key_where + ": unknown key (see input/README.md, \"Machine files\")");
      const double x = yaml_number(e);
      if (x < k->low)
        throw UserError(e.where + ": must be >= " + yaml_shortest(k->low) + ", got " +
                        yaml_shortest(x));
      if (x > k->high)
        throw UserError(e.where + ": must be <= " + yaml_shortest(k->high) + " (" + k->why +
                        "), got " + yaml_shortest(x));
      *k->value = x * k->scale;
    }
  }
  auto given = [&](const char* key) {
    return std::any_of(entries.begin(), entries.end(),
                       [&](const YamlEntry& e) { return e.key == key; });
  };
  for (const Key& k : keys)
    if (k.required && !given(k.name))
      throw UserError(origin + ":1:1: " + k.name + ": missing (required)");
  if (!per_node) throw UserError(origin + ":1:1: gpus_per_node: missing (required)");
  return m;
}

Machine load_machine(const std::string& path) {
  // A FIFO, a directory or a device is refused by what it is before anything opens it.
  return parse_machine(read_regular_file(path, "machine file", size_t(limits::kDeckBytes)), path);
}

}  // namespace tessera
