// Rotary position embeddings on the q and k heads of the packed qkv activation, the HF LLaMA
// convention (rotate_half: dimension i pairs with i + hs/2); twin of rope.cu.
#include <cmath>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

// cs (T, hs/2, 2): cs[t][i] = (cos, sin)(t * theta^(-2i/hs)), in double, stored as float.
void rope_table(float* cs, int T, int hs, double theta) {
  const int half = hs / 2;
  for (int i = 0; i < half; i++) {
    const double freq = std::pow(theta, -2.0 * i / hs);
    for (int t = 0; t < T; t++) {
      const double a = t * freq;
      cs[((size_t)t * half + i) * 2 + 0] = float(std::cos(a));
      cs[((size_t)t * half + i) * 2 + 1] = float(std::sin(a));
    }
  }
}

// The rotation of every q and k head of qkv (B,T,(NH+2*NKV)*hs) by its row's position, sin
// multiplied by `sign`: +1 the rotation, -1 its transpose (the backward). The q and k heads are
// the first NH + NKV heads of a row, so they are rotated as one run of heads.
template <typename F>
static void rotate(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs, F sign) {
  const int half = hs / 2, heads = NH + NKV;
  const size_t row_len = (size_t)(NH + 2 * NKV) * hs;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < B * T; r++) {
    const float* cst = cs + (size_t)(r % T) * half * 2;
    for (int h = 0; h < heads; h++) {
      F* x = qkv + r * row_len + (size_t)h * hs;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const F c = cst[2 * i], s = sign * F(cst[2 * i + 1]);
        const F a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
      }
    }
  }
}

template <typename F>
void rope_forward(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs) {
  rotate(qkv, cs, B, T, NH, NKV, hs, F(1));
}

// y = R x with R = [[c, -s], [s, c]] per pair, so dx = Rᵀ dy: the same rotation with -s.
template <typename F>
void rope_backward(F* dqkv, const float* cs, int B, int T, int NH, int NKV, int hs) {
  rotate(dqkv, cs, B, T, NH, NKV, hs, F(-1));
}

#define TESSERA_INSTANTIATE(F)                                                                     \
  template void rope_forward<F>(F*, const float*, int, int, int, int, int);                       \
  template void rope_backward<F>(F*, const float*, int, int, int, int, int);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::cpu
