// `gpu_tests --bench-experts`: the routed experts' GEMMs of one MoE layer (fc1 and fc2, forward
// and backward, bf16) one cuBLAS call per expert against one cublasGemmGroupedBatchedEx per
// product (device.expert_gemm: loop or grouped), at published MoE shapes on one GPU, the rows
// per expert balanced and skewed. Each cell is the median of 5 timed passes after 2 untimed,
// timed by events on the stream. The table says which is faster where: the choice of the
// default. `--tiny` runs the same passes at toy shapes (the emulator's check that it runs).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/ops.hpp"
#include "device/context.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {

namespace {

namespace gpu = tessera::cuda;

struct ExpertShape {
  const char* name;
  int C, F;       // model width, expert FFN width (SwiGLU: fc1 has 2F outputs)
  int held;       // experts on this GPU
  int rows;       // routed rows this GPU's experts compute (tokens x top_k / ep)
};

// Rows per expert summing to `rows`: equal, or skewed (expert e's share ∝ 1 / (e + 1), the
// heaviest about 3x the mean at 8 experts).
std::vector<int> split_rows(int rows, int held, bool skewed) {
  std::vector<double> share(static_cast<size_t>(held), 1.0);
  if (skewed)
    for (int e = 0; e < held; e++) share[size_t(e)] = 1.0 / (e + 1);
  double total = 0;
  for (double s : share) total += s;
  std::vector<int> counts(static_cast<size_t>(held));
  int given = 0;
  for (int e = 0; e < held; e++) given += counts[size_t(e)] = int(rows * share[size_t(e)] / total);
  counts[0] += rows - given;
  return counts;
}

// One MoE layer's expert tensors at a shape, bf16 (their weight gradients fp32), every byte
// 0x3c (bf16 0x3c3c: 0.0115; fp32 about 0.0115 too): finite everywhere, unlike Dev's NaN poison.
struct ExpertTensors {
  size_t R, C, F, E;
  Dev<gpu::bf16> x, h, a, y, dx, dh, da, dy, fc1, fc2;
  Dev<float> dfc1, dfc2;
  explicit ExpertTensors(const ExpertShape& s)
      : R(size_t(s.rows)), C(size_t(s.C)), F(size_t(s.F)), E(size_t(s.held)),
        x(R * C), h(R * 2 * F), a(R * F), y(R * C), dx(R * C), dh(R * 2 * F), da(R * F),
        dy(R * C), fc1(E * 2 * F * C), fc2(E * C * F), dfc1(E * 2 * F * C), dfc2(E * C * F) {
    for (Dev<gpu::bf16>* d : {&x, &h, &a, &y, &dx, &dh, &da, &dy, &fc1, &fc2}) finite(*d);
    for (Dev<float>* d : {&dfc1, &dfc2}) finite(*d);
  }
  template <typename T>
  static void finite(const Dev<T>& d) {
    ck(cudaMemsetAsync(d.get(), 0x3c, d.size() * sizeof(T), device::stream()), "cudaMemsetAsync");
  }
};

// Milliseconds of fc1 + fc2 forward and backward, the median of 5 after 2 untimed.
double pass_ms(const ExpertShape& s, const ExpertTensors& t, const std::vector<int>& counts,
               bool grouped) {
  using gpu::bf16;
  device::set_grouped_experts(grouped);
  std::vector<int> offsets(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); e++) offsets[e + 1] = offsets[e] + counts[e];
  const int held = s.held;
  auto pass = [&] {
    gpu::experts_forward<bf16>(t.h, t.x, t.fc1, nullptr, counts.data(), offsets.data(), held,
                               s.C, 2 * s.F);
    gpu::experts_forward<bf16>(t.y, t.a, t.fc2, nullptr, counts.data(), offsets.data(), held,
                               s.F, s.C);
    gpu::experts_backward<bf16>(t.da, t.dfc2, nullptr, t.dy, t.a, t.fc2, counts.data(),
                                offsets.data(), held, s.F, s.C);
    gpu::experts_backward<bf16>(t.dx, t.dfc1, nullptr, t.dh, t.x, t.fc1, counts.data(),
                                offsets.data(), held, s.C, 2 * s.F);
  };
  cudaEvent_t start, stop;
  ck(cudaEventCreate(&start), "cudaEventCreate");
  ck(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < 7; i++) {
    ck(cudaEventRecord(start, device::stream()), "cudaEventRecord");
    pass();
    ck(cudaEventRecord(stop, device::stream()), "cudaEventRecord");
    ck(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t_ms = 0;
    ck(cudaEventElapsedTime(&t_ms, start, stop), "cudaEventElapsedTime");
    if (i >= 2) ms.push_back(t_ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  device::set_grouped_experts(false);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int run_experts_bench(bool tiny) {
  // Mixtral 8x7B (C 4096, F 14336, 8 experts, top 2) at 4096 tokens, on one GPU (ep 1) and as
  // one of ep 4 (2 experts); Qwen3-30B-A3B (C 2048, F 768, 128 experts, top 8) at 4096 tokens
  // on one GPU and as one of ep 8 (16 experts); DeepSeek-V3 (C 7168, F 2048, 256 experts,
  // top 8) as one of ep 64 (4 experts) at 4096 tokens a rank.
  const std::vector<ExpertShape> shapes =
      tiny ? std::vector<ExpertShape>{{"toy 4 experts", 32, 48, 4, 64}}
           : std::vector<ExpertShape>{{"Mixtral 8x7B, ep 1", 4096, 14336, 8, 8192},
                                      {"Mixtral 8x7B, ep 4", 4096, 14336, 2, 8192},
                                      {"Qwen3-30B-A3B, ep 1", 2048, 768, 128, 32768},
                                      {"Qwen3-30B-A3B, ep 8", 2048, 768, 16, 32768},
                                      {"DeepSeek-V3, ep 64", 7168, 2048, 4, 32768}};
  std::printf("experts' GEMMs (fc1 + fc2, forward + backward, bf16): one per expert vs grouped\n");
  std::printf("| shape | rows/expert | experts | loop ms | grouped ms | loop/grouped |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const ExpertShape& s : shapes) {
    const ExpertTensors t(s);  // both ways and both row splits on the same tensors
    for (bool skewed : {false, true}) {
      const std::vector<int> counts = split_rows(s.rows, s.held, skewed);
      const int most = *std::max_element(counts.begin(), counts.end());
      const double loop = pass_ms(s, t, counts, false);
      // A shape this GPU's cuBLAS refuses grouped is a row that says so, not the end of the table.
      try {
        const double grouped = pass_ms(s, t, counts, true);
        std::printf("| %s | %s %d | %d | %.3f | %.3f | %.2f |\n", s.name,
                    skewed ? "skewed, max" : "balanced", most, s.held, loop, grouped, loop / grouped);
      } catch (const std::exception& e) {
        device::set_grouped_experts(false);
        std::printf("| %s | %s %d | %d | %.3f | refused: %s | |\n", s.name,
                    skewed ? "skewed, max" : "balanced", most, s.held, loop, e.what());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace tessera::gpu_test
