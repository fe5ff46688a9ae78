// bin/gpu_tests: every CUDA op against its CPU twin (test_ops.cpp), or with --bench the GPU
// benchmark (bench.cpp). On a machine without a usable GPU it says so and succeeds, so
// `make test-gpu` and `make bench-gpu` can run anywhere.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "device/select.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {

namespace {
uint64_t g_seed = 0;
}

uint64_t seed() { return g_seed; }
std::mt19937_64& rng() {
  static std::mt19937_64 r(g_seed);
  return r;
}

Compare compare(const std::vector<double>& got, const std::vector<double>& want,
                const std::vector<double>* terms) {
  Compare c;
  if (got.size() != want.size()) {
    c.problem = "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
    return c;
  }
  double scale = 0.0, diff = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) {
      std::ostringstream s;
      s << "element " << i << " is " << got[i] << " (want " << want[i]
        << "): not written (the NaN poison survived) or overflowed";
      c.problem = s.str();
      return c;
    }
    scale = std::max(scale, std::fabs(want[i]));
    const double d = std::fabs(got[i] - want[i]);
    if (d > diff) {
      diff = d;
      c.worst = i;
    }
  }
  c.rel = scale > 0.0 ? diff / scale : diff;
  // Outputs of 64 elements or more whose every value a bf16 holds: bf16 outputs (an fp32 result
  // of that many elements is all bf16 values with no real chance).
  if (got.size() < 64) return c;
  for (double g : got)
    if (round_to<bf16>(g) != g) return c;
  c.bf16_values = true;
  double sum = 0.0;
  size_t n = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double w = round_to<bf16>(want[i]);
    if (w == 0.0 || !std::isfinite(w)) continue;
    if (terms && std::fabs(want[i]) < std::ldexp((*terms)[i], -12)) continue;
    int e = 0;
    std::frexp(w, &e);                            // |w| = m 2^e, m in [0.5, 1)
    const double ulp = std::ldexp(1.0, e - 8);    // bf16: 8 significant bits
    const double err = (got[i] - w) / ulp * (w > 0 ? 1.0 : -1.0);
    c.max_ulps = std::max(c.max_ulps, std::fabs(err));
    // The bias of the final rounding shows in the elements that are within an ulp or so of the
    // reference; those an op's earlier bf16 roundings moved further (a sum of small products
    // near zero) carry noise of either sign that would drown it.
    if (std::fabs(err) > 1.5) continue;
    sum += err;
    n++;
  }
  c.bias_ulps = n ? sum / double(n) : 0.0;
  return c;
}

int run_bench(double budget_s);
int run_experts_bench(bool tiny);

// GPUs the NVIDIA kernel driver knows of: entries of /proc/driver/nvidia/gpus (or of the folder
// TESSERA_NVIDIA_PROC names, for the test of this check), else /dev/nvidia0, 1, ... files.
int gpus_present() {
  const char* dir = std::getenv("TESSERA_NVIDIA_PROC");
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir ? dir : "/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    n++;
  }
  if (n > 0 || dir) return n;
  while (std::filesystem::exists("/dev/nvidia" + std::to_string(n), ec)) n++;
  return n;
}

}  // namespace tessera::gpu_test

// Under mpiexec (make test-gpu does this where two GPUs are visible) each rank takes the GPU of
// its node-local rank, as tessera does, and the tensor-parallel tests run over NCCL; alone, those
// tests skip.
int main(int argc, char** argv) {
  using namespace tessera;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // --bench [--budget SECONDS]: the bench, no row started after that many seconds;
  // --bench-experts [--tiny]: the experts' GEMMs looped and grouped (bench_experts.cpp).
  bool bench = false, experts = false, tiny = false;
  double budget = 0;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--bench") == 0) bench = true;
    if (std::strcmp(argv[i], "--bench-experts") == 0) bench = experts = true;
    if (std::strcmp(argv[i], "--tiny") == 0) tiny = true;
    if (std::strcmp(argv[i], "--budget") == 0 && i + 1 < argc) budget = std::atof(argv[i + 1]);
  }
  const char* what = bench ? "bench-gpu" : "test-gpu";
  int count = 0, driver = 0, runtime = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (rank == 0)
    std::printf("%s: CUDA driver %d.%d, runtime %d.%d, CUDA_VISIBLE_DEVICES=%s\n", what,
                driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
                visible ? visible : "(unset)");
  if (err != cudaSuccess || count == 0) {
    const char* reason = err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found 0";
    // Skipped only where there is no GPU at all: a GPU that CUDA cannot use (a driver older than
    // the runtime, CUDA_VISIBLE_DEVICES naming none) is a failure, not a pass.
    const int present = gpu_test::gpus_present();
    if (present > 0) {
      if (rank == 0)
        std::printf("%s: FAILED: %d GPU%s present, but CUDA cannot use %s: %s\n", what, present,
                    present == 1 ? " is" : "s are", present == 1 ? "it" : "them", reason);
      MPI_Finalize();
      return 1;
    }
    if (rank == 0) std::printf("%s: no GPU: skipped (%s)\n", what, reason);
    MPI_Finalize();
    return 0;
  }
  MPI_Comm node = device::node_comm(MPI_COMM_WORLD);
  const int dev = device::pick_device(device::node_local_rank(node), count);
  MPI_Comm_free(&node);
  if (dev < 0) {
    std::printf("rank %d: more ranks on this node than its %d GPUs\n", rank, count);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  gpu_test::ck(cudaSetDevice(dev), "cudaSetDevice");
  cudaDeviceProp prop;
  gpu_test::ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  std::printf("rank %d: GPU %d of %d: %s, sm_%d%d, %.1f GB\n", rank, dev, count, prop.name,
              prop.major, prop.minor, prop.totalGlobalMem / 1e9);
  device::init();
  int rc = 0;
  if (bench) {
    rc = rank != 0 ? 0 : experts ? gpu_test::run_experts_bench(tiny) : gpu_test::run_bench(budget);
  } else {
    const char* s = std::getenv("TESSERA_GPU_TEST_SEED");
    unsigned long long seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);  // the same inputs on every rank
    gpu_test::g_seed = seed;
    if (rank == 0) std::printf("seed %llu (replay with TESSERA_GPU_TEST_SEED=%llu)\n", seed, seed);
    ::testing::InitGoogleTest(&argc, argv);
    rc = RUN_ALL_TESTS();
  }
  device::shutdown();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
