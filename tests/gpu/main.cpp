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

Compare compare(const std::vector<double>& got, const std::vector<double>& want) {
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
  return c;
}

int run_bench();

}  // namespace tessera::gpu_test

// Under mpiexec (make test-gpu does this where two GPUs are visible) each rank takes the GPU of
// its node-local rank, as tessera does, and the tensor-parallel tests run over NCCL; alone, those
// tests skip.
int main(int argc, char** argv) {
  using namespace tessera;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool bench = false;
  for (int i = 1; i < argc; i++)
    if (std::strcmp(argv[i], "--bench") == 0) bench = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (rank == 0)
      std::printf("%s: no GPU: skipped (%s)\n", bench ? "bench-gpu" : "test-gpu",
                  err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found 0");
    MPI_Finalize();
    return 0;
  }
  const int dev = device::pick_device(device::node_local_rank(MPI_COMM_WORLD), count);
  if (dev < 0) {
    std::printf("rank %d: more ranks on this node than its %d GPUs\n", rank, count);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  gpu_test::ck(cudaSetDevice(dev), "cudaSetDevice");
  cudaDeviceProp prop;
  gpu_test::ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  std::printf("rank %d: GPU %d of %d: %s, sm_%d%d, %.1f GB\n", rank, dev, count, prop.name,
              prop.major, prop.minor, prop.totalGlobalMem / 1e9);
  cuda::init();
  int rc = 0;
  if (bench) {
    rc = rank == 0 ? gpu_test::run_bench() : 0;
  } else {
    const char* s = std::getenv("TESSERA_GPU_TEST_SEED");
    unsigned long long seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);  // the same inputs on every rank
    gpu_test::g_seed = seed;
    if (rank == 0) std::printf("seed %llu (replay with TESSERA_GPU_TEST_SEED=%llu)\n", seed, seed);
    ::testing::InitGoogleTest(&argc, argv);
    rc = RUN_ALL_TESTS();
  }
  cuda::shutdown();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
