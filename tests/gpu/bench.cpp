// `make bench-gpu`: tokens/s and MFU of a GPT-2-shaped training step made of the CUDA ops, for
// the GPT-2 124M shape and a 1.3B shape, in bf16, against the device's bf16 tensor-core peak.
//
// What is timed, honestly: there is no GPU trainer yet, so this is the op sequence of one
// training step (embedding, L x transformer block forward, LM head + vocab cross-entropy, their
// backwards in reverse, the gradient norm and AdamW over every parameter), with ONE layer's
// weights and activations reused for all L layers. The kernels and GEMM shapes are the model's;
// the memory traffic of L distinct layers (and any communication) is not.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.hpp"

namespace tessera::gpu_test {

namespace {

namespace gpu = tessera::cuda;

struct Shape {
  const char* name;
  int L, C, NH, T, B;
  int V;  // padded vocabulary
};

// Device memory for the bench, poisoned-free (zeros are fine for timing).
template <typename T>
T* dalloc(size_t n, std::vector<void*>& all) {
  void* p = nullptr;
  ck(cudaMalloc(&p, n * sizeof(T) + 16), "cudaMalloc (bench)");
  ck(cudaMemsetAsync(p, 0, n * sizeof(T), gpu::stream()), "cudaMemsetAsync");
  all.push_back(p);
  return static_cast<T*>(p);
}

// The dense bf16 tensor-core peak of the device, FLOP/s, or 0 when not known. Datasheet figures
// (dense, no sparsity): A100 312 TFLOP/s; H100 SXM and H200 989; H100 PCIe 756.
// TESSERA_BF16_PEAK_TFLOPS overrides.
double bf16_peak(const cudaDeviceProp& p) {
  if (const char* s = std::getenv("TESSERA_BF16_PEAK_TFLOPS")) return std::atof(s) * 1e12;
  const std::string name = p.name;
  if (p.major == 9) return name.find("PCIe") != std::string::npos ? 756e12 : 989e12;
  if (p.major == 8 && p.minor == 0) return 312e12;
  return 0.0;
}

double bench_shape(const Shape& s, double peak) {
  using F = bf16;
  std::vector<void*> all;
  const int C = s.C, BT = s.B * s.T, V = s.V;
  const size_t n_block = 12ull * C * C + 13ull * C;  // per layer: weights and biases, LNs
  const size_t n_params = size_t(s.L) * n_block + size_t(V) * C + size_t(s.T) * C + 2 * C;
  // weights of one layer (bf16) and their fp32 gradients
  F* ln1w = dalloc<F>(C, all); F* ln1b = dalloc<F>(C, all);
  F* qkvw = dalloc<F>(3ull * C * C, all); F* qkvb = dalloc<F>(3 * C, all);
  F* projw = dalloc<F>(1ull * C * C, all); F* projb = dalloc<F>(C, all);
  F* ln2w = dalloc<F>(C, all); F* ln2b = dalloc<F>(C, all);
  F* fcw = dalloc<F>(4ull * C * C, all); F* fcb = dalloc<F>(4 * C, all);
  F* fcpw = dalloc<F>(4ull * C * C, all); F* fcpb = dalloc<F>(C, all);
  F* wte = dalloc<F>(size_t(V) * C, all); F* wpe = dalloc<F>(size_t(s.T) * C, all);
  float* g = dalloc<float>(n_block, all);  // one layer's gradients, reused (timing only)
  float* gwte = dalloc<float>(size_t(V) * C, all); float* gwpe = dalloc<float>(size_t(s.T) * C, all);
  // activations of one layer
  const size_t act = size_t(BT) * C;
  F* x = dalloc<F>(act, all); F* ln1 = dalloc<F>(act, all); F* qkv = dalloc<F>(3 * act, all);
  F* att = dalloc<F>(size_t(s.B) * s.NH * s.T * s.T, all); F* atty = dalloc<F>(act, all);
  F* proj = dalloc<F>(act, all); F* res = dalloc<F>(act, all); F* ln2 = dalloc<F>(act, all);
  F* fc = dalloc<F>(4 * act, all); F* fcg = dalloc<F>(4 * act, all); F* out = dalloc<F>(act, all);
  float* mean = dalloc<float>(BT, all); float* rstd = dalloc<float>(BT, all);
  F* logits = dalloc<F>(size_t(BT) * V, all);
  float* rmax = dalloc<float>(BT, all); float* losses = dalloc<float>(BT, all);
  double* sums = dalloc<double>(2ull * BT, all);
  F* dx = dalloc<F>(act, all); F* dqkv = dalloc<F>(3 * act, all);
  F* datt = dalloc<F>(size_t(s.B) * s.NH * s.T * s.T, all); F* dfc = dalloc<F>(4 * act, all);
  F* dfc2 = dalloc<F>(4 * act, all);
  F* dtmp = dalloc<F>(act, all);
  std::vector<int32_t> host_tokens(static_cast<size_t>(BT));
  for (size_t i = 0; i < host_tokens.size(); i++) host_tokens[i] = int32_t((i * 7919) % 50257);
  int32_t* tokens = dalloc<int32_t>(BT, all);
  ck(cudaMemcpy(tokens, host_tokens.data(), BT * sizeof(int32_t), cudaMemcpyHostToDevice),
     "cudaMemcpy tokens");
  // optimizer state of every parameter (fp32 master, grads, moments, bf16 copy)
  float* master = dalloc<float>(n_params, all); float* grads = dalloc<float>(n_params, all);
  float* m = dalloc<float>(n_params, all); float* v = dalloc<float>(n_params, all);
  F* copy = dalloc<F>(n_params, all);
  // slices of the one-layer gradient buffer
  float* gl1w = g; float* gl1b = gl1w + C; float* gqkvw = gl1b + C; float* gqkvb = gqkvw + 3ull * C * C;
  float* gprojw = gqkvb + 3 * C; float* gprojb = gprojw + 1ull * C * C; float* gl2w = gprojb + C;
  float* gl2b = gl2w + C; float* gfcw = gl2b + C; float* gfcb = gfcw + 4ull * C * C;
  float* gfcpw = gfcb + 4 * C; float* gfcpb = gfcpw + 4ull * C * C;

  auto step = [&]() {
    gpu::encoder_forward<F>(x, tokens, wte, wpe, s.B, s.T, C, 0, V);
    for (int l = 0; l < s.L; l++) {
      gpu::layernorm_forward<F>(ln1, mean, rstd, x, ln1w, ln1b, BT, C);
      gpu::matmul_forward<F>(qkv, ln1, qkvw, qkvb, BT, C, 3 * C);
      gpu::attention_forward<F>(atty, att, qkv, s.B, s.T, C, s.NH);
      gpu::matmul_forward<F>(proj, atty, projw, projb, BT, C, C);
      gpu::residual_forward<F>(res, x, proj, act);
      gpu::layernorm_forward<F>(ln2, mean, rstd, res, ln2w, ln2b, BT, C);
      gpu::matmul_forward<F>(fc, ln2, fcw, fcb, BT, C, 4 * C);
      gpu::gelu_forward<F>(fcg, fc, 4 * act);
      gpu::matmul_forward<F>(out, fcg, fcpw, fcpb, BT, 4 * C, C);
      gpu::residual_forward<F>(x, res, out, act);
    }
    gpu::layernorm_forward<F>(ln1, mean, rstd, x, ln1w, ln1b, BT, C);
    gpu::matmul_forward<F>(logits, ln1, wte, nullptr, BT, C, V);
    gpu::crossentropy_row_max<F>(rmax, logits, BT, V, 50257);
    gpu::crossentropy_exp_sums<F>(sums, logits, logits, rmax, tokens, BT, V, 50257, 0);
    gpu::crossentropy_finish<F>(losses, logits, sums, BT, V, 50257);
    gpu::crossentropy_backward<F>(logits, logits, tokens, 1.0f / BT, BT, V, 50257, 0);
    gpu::matmul_backward<F>(dx, gwte, nullptr, logits, ln1, wte, BT, C, V);
    for (int l = 0; l < s.L; l++) {
      gpu::matmul_backward<F>(dfc, gfcpw, gfcpb, dx, fcg, fcpw, BT, 4 * C, C);
      gpu::gelu_backward<F>(dfc2, fc, dfc, 4 * act);
      gpu::matmul_backward<F>(dtmp, gfcw, gfcb, dfc2, ln2, fcw, BT, C, 4 * C);
      gpu::layernorm_backward<F>(dx, gl2w, gl2b, dtmp, res, ln2w, mean, rstd, BT, C);
      gpu::matmul_backward<F>(dtmp, gprojw, gprojb, dx, atty, projw, BT, C, C);
      gpu::attention_backward<F>(dqkv, datt, dtmp, qkv, att, s.B, s.T, C, s.NH);
      gpu::matmul_backward<F>(dtmp, gqkvw, gqkvb, dqkv, ln1, qkvw, BT, C, 3 * C);
      gpu::layernorm_backward<F>(dx, gl1w, gl1b, dtmp, x, ln1w, mean, rstd, BT, C);
    }
    gpu::encoder_backward<F>(gwte, gwpe, dx, tokens, s.B, s.T, C, 0, V);
    const double norm2 = gpu::sum_of_squares(grads, n_params);
    gpu::scale(grads, n_params, float(clip_factor(std::sqrt(norm2), 1.0)));
    gpu::adamw_update(master, copy, grads, m, v, n_params, true, AdamWHyper{}, 1e-4, 1);
  };

  step();  // warm-up: cuBLAS heuristics, first-touch
  step();
  ck(cudaStreamSynchronize(gpu::stream()), "sync");
  cudaEvent_t t0, t1;
  ck(cudaEventCreate(&t0), "cudaEventCreate");
  ck(cudaEventCreate(&t1), "cudaEventCreate");
  const int iters = 5;
  ck(cudaEventRecord(t0, gpu::stream()), "cudaEventRecord");
  for (int i = 0; i < iters; i++) step();
  ck(cudaEventRecord(t1, gpu::stream()), "cudaEventRecord");
  ck(cudaEventSynchronize(t1), "cudaEventSynchronize");
  float ms = 0.0f;
  ck(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  for (void* p : all) cudaFree(p);

  const double sec = ms / 1e3 / iters;
  const double tokens_per_s = double(BT) / sec;
  // README / FORMULAS.md: 6 N_matmul + 12 L C T FLOPs per token, LM head included.
  const double n_matmul = double(s.L) * 12.0 * C * C + double(V) * C;
  const double flops_per_token = 6.0 * n_matmul + 12.0 * s.L * C * s.T;
  const double mfu = peak > 0 ? tokens_per_s * flops_per_token / peak : 0.0;
  std::printf("| %s (L=%d C=%d NH=%d T=%d B=%d, %.2fB params) | %.1f ms | %.0f | %s |\n", s.name,
              s.L, C, s.NH, s.T, s.B, n_params / 1e9, sec * 1e3, tokens_per_s,
              peak > 0 ? (std::to_string(mfu * 100.0).substr(0, 5) + "%").c_str() : "peak unknown");
  return tokens_per_s;
}

}  // namespace

int run_bench() {
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const double peak = bf16_peak(prop);
  std::printf("bench-gpu: bf16 op sequence of a training step (one layer's buffers reused for all "
              "L layers; not the trainer) on %s, bf16 peak %.0f TFLOP/s%s\n",
              prop.name, peak / 1e12, peak > 0 ? "" : " (unknown: set TESSERA_BF16_PEAK_TFLOPS)");
  std::printf("| shape | ms/step | tokens/s | MFU |\n|---|---|---|---|\n");
  bench_shape({"GPT-2 124M", 12, 768, 12, 1024, 8, 50304}, peak);
  bench_shape({"1.3B", 24, 2048, 16, 1024, 4, 50304}, peak);
  return 0;
}

}  // namespace tessera::gpu_test
