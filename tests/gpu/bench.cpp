// `make bench-gpu`, tessera's half: tokens/s, MFU and device memory of the trainer's own training
// step (engine/engine.hpp: the model, pipeline executor and distributed optimizer over the CUDA
// backend) on one GPU, for the GPT-2 124M shape and a 1.3B shape, bf16 and fp32, fused and gemm
// attention, and fp8 (the linear layers on cuBLASLt's FP8 GEMM, bf16 elsewhere) with fused
// attention beside bf16's; and LLaMA 3.2 1B's shape in bf16 and fp8. The step is the trainer's: the token upload, the forward and backward, the gradient
// norm, clipping and AdamW, ending in a stream synchronisation, timed on the host over 5 steps
// after one to warm up. Tokens are synthetic. tools/bench/gpu_torch.py prints PyTorch's rows of
// the same table.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/ops.hpp"
#include "gpu_test.hpp"
#include "model/param_layout.hpp"
#include "model/shard.hpp"
#include "pipeline/schedule.hpp"
#include "engine/engine.hpp"
#include "parallel/layout.hpp"

namespace tessera::gpu_test {

namespace {

struct Shape {
  const char* name;
  ModelConfig model;
  int vocab, T, B;
};

ModelConfig config(Arch arch, int L, int NH, int NKV, int C, int F, int T) {
  ModelConfig m;
  m.arch = arch;
  m.n_layer = L;
  m.n_head = NH;
  m.n_kv_head = NKV;
  m.n_embd = C;
  m.ffn_hidden = F;
  m.block_size = T;
  m.tie_embeddings = Tie::True;
  return m;
}

ModelOptions bench_options(bool fused, bool fp8) {
  ModelOptions o{fused, Recompute::None};
  o.fp8.on = fp8;
  return o;
}

enum class Precision { Fp32, Bf16, Fp8 };
const char* name(Precision p) { return p == Precision::Fp32 ? "fp32" : p == Precision::Bf16 ? "bf16" : "fp8"; }

// One row: `| shape | tessera | precision | attention | ms/step | tokens/s | MFU | memory |`, MFU
// against the bf16 peak whatever the precision (the figure PyTorch's rows use too), memory the
// device memory the run took (cudaMemGetInfo before and after building the engine and stepping).
void bench_shape(const Shape& s, Precision precision, bool fused, double bf16_peak) {
  const ModelShape shape = make_model_shape(s.model, s.vocab);
  const LocalLayout tile = make_local_layout(shape, 1, 0, 0, shape.n_layer, true, true);
  const Mesh mesh(MPI_COMM_SELF, mesh_shape(ParallelLayout{1, 1, 1}));
  size_t free_before = 0, free_after = 0, total = 0;
  // Where a row's set-up goes (the first H200 lease spent about 35 s a row outside the timed
  // steps): the engine's build, the host's initialisation, the upload, the first step.
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const Clock::time_point t_row = Clock::now();
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  ck(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
  const EngineSetup setup{.tile = tile,
                          .mesh = &mesh,
                          .schedule = make_schedule(ScheduleKind::OneFOneB, 0, 1, 1),
                          .micro_batch = s.B,
                          .seq_len = s.T,
                          .n_micro = 1,
                          .model = bench_options(fused, precision == Precision::Fp8)};
  const std::unique_ptr<TrainEngine> engine = make_engine(
      setup, precision == Precision::Fp32 ? EngineKind::cuda_fp32 : EngineKind::cuda_bf16);
  const double t_build = since(t_row);
  Clock::time_point t = Clock::now();
  init_local_parameters(engine->host_params(), tile, 1337, 0.02);
  const double t_init = since(t);
  t = Clock::now();
  engine->params_to_device();
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double t_upload = since(t);
  const size_t n = size_t(s.B) * s.T;
  std::vector<int32_t> tokens(n), targets(n);
  for (size_t i = 0; i < n; i++) {
    tokens[i] = int32_t((i * 7919) % size_t(s.vocab));
    targets[i] = int32_t((i * 104729 + 1) % size_t(s.vocab));
  }
  const std::vector<HostMicroBatch> batch = {{tokens.data(), targets.data()}};
  const float dloss = 1.0f / float(n);
  long step = 1;
  t = Clock::now();
  engine->train_step(batch, dloss, 1.0, 1e-4, step++);
  const double t_first = since(t);
  ck(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
  const int iters = 5;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; i++) engine->train_step(batch, dloss, 1.0, 1e-4, step++);
  const double sec = since(t0) / iters;
  const double tokens_per_s = double(n) / sec;
  const double mfu = bf16_peak > 0 ? tokens_per_s * flops_per_token(shape, s.T) / bf16_peak : 0.0;
  std::printf("| %s (L=%d C=%d NH=%d T=%d B=%d, %.2fB params) | tessera | %s | %s | %.1f | %.0f | "
              "%.1f%% | %.2f GB (activations %.2f GB) |\n",
              s.name, shape.n_layer, shape.n_embd, shape.n_head, s.T, s.B, tile.total / 1e9,
              name(precision),
              fused ? "fused" : "gemm", sec * 1e3, tokens_per_s, mfu * 100,
              double(free_before - free_after) / 1e9, double(engine->activation_bytes()) / 1e9);
  std::printf("bench-gpu: %s %s: set-up %.1f s (engine %.1f, host initialisation %.1f, upload "
              "%.1f, first step %.1f)\n", s.name, name(precision), since(t_row) - sec * iters,
              t_build, t_init, t_upload, t_first);
  std::fflush(stdout);
}

}  // namespace

// The shapes `make bench-gpu` runs (tools/bench/gpu_torch.py runs the same ones in PyTorch), in
// the order of their value to a first, short look at a GPU (the bundle's budget may stop it
// early): GPT-2 124M and the 1.3B shape in bf16, LLaMA 3.2 1B's shape (16 layers of 2048, 32 query
// and 8 key/value heads, SwiGLU 8192, tied 128K vocabulary) in bf16 and fp8 (FP8's speed), the
// GPT-2 shapes in fp8, bf16 with the gemm attention, then fp32. Each row is printed as it finishes.
// `budget_s` > 0: no row starts once that many seconds have passed (one row of a 1.3B shape takes
// a few seconds, its host-side initialisation included).
int run_bench(double budget_s) {
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  double peak = cuda::peak_gflops(/*bf16=*/true, /*fp8=*/false) * 1e9;
  if (const char* p = std::getenv("TESSERA_BF16_PEAK_TFLOPS")) peak = std::atof(p) * 1e12;
  std::printf("bench-gpu: the trainer's training step on one %s; MFU against the bf16 dense peak "
              "%.0f TFLOP/s (TESSERA_BF16_PEAK_TFLOPS overrides it)\n",
              prop.name, peak / 1e12);
  if (peak <= 0) {
    std::printf("bench-gpu: no datasheet peak for this GPU: set TESSERA_BF16_PEAK_TFLOPS\n");
    return 1;
  }
  std::printf("| shape | trainer | precision | attention | ms/step | tokens/s | MFU | memory |\n"
              "|---|---|---|---|---|---|---|---|\n");
  const Shape gpt2{"GPT-2 124M", config(Arch::Gpt2, 12, 12, 0, 768, 0, 1024), 50257, 1024, 8};
  const Shape big{"1.3B", config(Arch::Gpt2, 24, 16, 0, 2048, 0, 1024), 50257, 1024, 4};
  const Shape llama{"LLaMA 1B", config(Arch::Llama, 16, 32, 8, 2048, 8192, 1024), 128256, 1024, 4};
  struct Row {
    const Shape* shape;
    Precision precision;
    bool fused;
  };
  const Precision bf = Precision::Bf16, f8 = Precision::Fp8, f32 = Precision::Fp32;
  const Row rows[] = {{&gpt2, bf, true},   {&big, bf, true},    {&llama, bf, true},
                      {&llama, f8, true},  {&gpt2, f8, true},   {&big, f8, true},
                      {&gpt2, bf, false},  {&big, bf, false},   {&gpt2, f32, true},
                      {&gpt2, f32, false}, {&big, f32, true},   {&big, f32, false}};
  const auto start = std::chrono::steady_clock::now();
  int done = 0;
  for (const Row& r : rows) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (budget_s > 0 && elapsed > budget_s) {
      std::printf("\nbench-gpu: the budget of %.0f s was spent after %d of %zu rows (%.0f s): the "
                  "rest were not run\n", budget_s, done, std::size(rows), elapsed);
      break;
    }
    bench_shape(*r.shape, r.precision, r.fused, peak);
    done++;
  }
  std::printf("\n%s\n", cuda::fp8_report().c_str());
  return 0;
}

}  // namespace tessera::gpu_test
