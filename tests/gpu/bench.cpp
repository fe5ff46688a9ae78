// `make bench-gpu`: tokens/s and MFU of the trainer's own training step (train/engine.hpp: the
// model, pipeline executor and distributed optimizer over the CUDA backend) on one GPU, for the
// GPT-2 124M shape and a 1.3B shape, bf16 and fp32, against the device's datasheet peak for that
// precision (the figure the trainer's MFU uses). The step is the trainer's: the token upload, the
// forward and backward, the gradient norm, clipping and AdamW, ending in a stream synchronisation,
// timed on the host over 5 steps after one to warm up. Tokens are synthetic.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "model/param_layout.hpp"
#include "model/shard.hpp"
#include "pipeline/schedule.hpp"
#include "train/engine.hpp"

namespace tessera::gpu_test {

namespace {

struct Shape {
  const char* name;
  int L, C, NH, T, B;
};

void bench_shape(const Shape& s, bool bf16) {
  const ModelShape shape = make_model_shape(s.L, s.NH, s.C, s.T, 50257, 64);
  const LocalLayout tile = make_local_layout(shape, 1, 0, 0, s.L, true, true);
  Comm world(MPI_COMM_SELF);
  const EngineSetup setup{tile, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, &world,
                          make_schedule(ScheduleKind::OneFOneB, 0, 1, 1), s.B, s.T, 1,
                          false, false, AdamWHyper{}};
  const std::unique_ptr<TrainEngine> engine = make_engine(setup, /*cuda=*/true, bf16);
  init_local_parameters(engine->host_params(), tile, 1337, 0.02);
  engine->params_to_device();
  const size_t n = size_t(s.B) * s.T;
  std::vector<int32_t> tokens(n), targets(n);
  for (size_t i = 0; i < n; i++) {
    tokens[i] = int32_t((i * 7919) % 50257);
    targets[i] = int32_t((i * 104729 + 1) % 50257);
  }
  const std::vector<HostMicroBatch> batch = {{tokens.data(), targets.data()}};
  const float dloss = 1.0f / float(n);
  long t = 1;
  engine->train_step(batch, dloss, 1.0, 1e-4, t++);
  const int iters = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) engine->train_step(batch, dloss, 1.0, 1e-4, t++);
  const double sec =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  double peak = engine->peak_gflops() * 1e9;
  if (const char* p = std::getenv(bf16 ? "TESSERA_BF16_PEAK_TFLOPS" : "TESSERA_FP32_PEAK_TFLOPS"))
    peak = std::atof(p) * 1e12;
  const double tokens_per_s = double(n) / sec;
  const double mfu = peak > 0 ? tokens_per_s * flops_per_token(shape, s.T) / peak : 0.0;
  char mfu_text[32];
  std::snprintf(mfu_text, sizeof mfu_text, peak > 0 ? "%.1f%%" : "peak unknown", mfu * 100);
  std::printf("| %s (L=%d C=%d NH=%d T=%d B=%d, %.2fB params) | %s | %.1f ms | %.0f | %s |\n",
              s.name, s.L, s.C, s.NH, s.T, s.B, tile.total / 1e9, bf16 ? "bf16" : "fp32",
              sec * 1e3, tokens_per_s, mfu_text);
}

}  // namespace

int run_bench() {
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("bench-gpu: the trainer's training step on one %s (TESSERA_BF16_PEAK_TFLOPS and "
              "TESSERA_FP32_PEAK_TFLOPS override the datasheet peaks)\n",
              prop.name);
  std::printf("| shape | precision | ms/step | tokens/s | MFU |\n|---|---|---|---|---|\n");
  for (bool bf16 : {true, false}) {
    bench_shape({"GPT-2 124M", 12, 768, 12, 1024, 8}, bf16);
    bench_shape({"1.3B", 24, 2048, 16, 1024, 4}, bf16);
  }
  return 0;
}

}  // namespace tessera::gpu_test
