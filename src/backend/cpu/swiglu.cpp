// SwiGLU, LLaMA's MLP activation: silu(gate) * up on the packed (gate | up) rows of the fused
// gate/up projection; twin of swiglu.cu.
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// exp overflowing to inf for very negative g gives silu -0 and sigmoid 0, the right limits.
template <typename F>
static inline F silu(F g) {
  return g / (F(1) + std::exp(-g));
}

// inp (N,2H): gate in columns [0,H), up in [H,2H). out (N,H) = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)), as torch.nn.functional.silu.
template <typename F>
void swiglu_forward(F* out, const F* inp, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* gate = inp + (size_t)n * 2 * H;
    const F* up = gate + H;
    F* o = out + (size_t)n * H;
    for (int j = 0; j < H; j++) o[j] = silu(gate[j]) * up[j];
  }
}

// Accumulates dinp (N,2H) from dout (N,H): d(gate) = dout * up * silu'(gate), d(up) = dout *
// silu(gate), where silu'(g) = sg (1 + g (1 - sg)), sg = sigmoid(g) (torch's silu_backward).
template <typename F>
void swiglu_backward(F* dinp, const F* inp, const F* dout, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const F* gate = inp + (size_t)n * 2 * H;
    const F* up = gate + H;
    const F* d = dout + (size_t)n * H;
    F* dgate = dinp + (size_t)n * 2 * H;
    F* dup = dgate + H;
    for (int j = 0; j < H; j++) {
      const F g = gate[j], e1 = F(1) + std::exp(-g), sg = F(1) / e1;
      dgate[j] += d[j] * up[j] * (sg * (F(1) + g * (F(1) - sg)));
      dup[j] += d[j] * (g / e1);
    }
  }
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void swiglu_forward<F>(F*, const F*, int, int);                                        \
  template void swiglu_backward<F>(F*, const F*, const F*, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
