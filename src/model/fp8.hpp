#pragma once
// FP8 training (device.precision: fp8): the GEMMs of every linear layer take FP8 inputs with
// per-tensor delayed scaling, the recipe of NVIDIA's Transformer Engine ("FP8 Formats for Deep
// Learning", Micikevicius et al. 2022):
//
//   forward   out = dq(q(x, s_x)) · dq(q(w, s_w))ᵀ          x, w in E4M3
//   backward  dx = dq(q(g, s_g)) · dq(q(w, s_w))           g in E5M2 (fp8_format hybrid) or E4M3
//             dw = dq(q(g, s_g))ᵀ · dq(q(x, s_x))          db from the unquantized g
//
// q(t, s) rounds t·s to the FP8 grid (saturating, common/fp8.hpp), dq divides by s again; the
// GEMM itself accumulates in fp32. On the CPU that is the whole simulation: the rounded values
// are fp32 and the GEMM is sgemm. On CUDA the same, in bf16 activations: the rounding is CUDA's
// own conversion (backend/cuda/fp8.cu), the dequantized values are stored in bf16 and the GEMM
// is cuBLAS's bf16 one, so a GPU trains the FP8 recipe's numbers but at bf16's speed; the
// cuBLASLt GEMM on one-byte operands, which gives FP8's speed, is still to come.
//
// Each FP8 tensor (per layer: the inputs, the weights and the output gradients of its four GEMMs,
// qkv, proj, fc (LLaMA: gate and up together), down; the LM head's three with fp8_head) has an
// amax history of fp8_amax_history steps. Its scale for a step is
//   s = (max of its format / amax) / 2^margin,  amax = max of the history (or its newest entry)
// fixed before the step from the steps before it (delayed scaling); the step's own amaxes, the
// largest over its micro-batches, wait in `pending` until the step ends (Fp8State::commit), and
// a skipped step (the anomaly policy) drops them: its history stays untouched.
//
// The first step has no history: each tensor then uses its current amax, reduced over the
// tensor-parallel ranks at the GEMM, so every rank of a tile uses one scale (and over the
// context-parallel ones, which hold the same tile and split the same sequences). The amaxes a step
// commits are reduced over tp, cp and dp (by the engine), so from the second step on every
// layout computes the same scales from the same numbers.
#include <cstddef>
#include <vector>

#include "backend/arena.hpp"
#include "model/options.hpp"

namespace tessera {

class Fp8State {
 public:
  enum Gemm { kQkv, kProj, kFc, kDown, kGemms };
  enum Role { kInput, kWeight, kGrad, kRoles };
  static constexpr int kHead = -1;  // the layer index of the LM head's GEMM
  static constexpr int kPerLayer = int(kGemms) * int(kRoles);

  // The layers [begin, end) of a model chunk, and the LM head where `head`.
  Fp8State(const Fp8Options& options, int begin, int end, bool head);

  bool covers(int layer) const { return layer == kHead ? head_ : layer >= begin_ && layer < end_; }
  // A tensor's index in the state.
  int tensor(int layer, int gemm, Role role) const;
  Fp8Format format(Role role) const { return role == kGrad ? options_.grad : Fp8Format::E4M3; }
  // The scale of tensor i this step: from its history, or without one from `current` (see the
  // top of the file). 1 where the amax is 0 or gives no finite scale.
  float scale(int i, float current) const;
  bool has_history(int i) const { return history_[size_t(i) * H()] >= 0; }
  // The step's amax of tensor i, kept as the largest seen (NaN sticks).
  void observe(int i, float amax) {
    float& p = pending_[size_t(i)];
    if (p == p && !(amax <= p)) p = amax;  // p == p: not NaN
  }
  // The step's amaxes, in tensor order (the engine reduces them over its communicators).
  std::vector<float>& pending() { return pending_; }
  // Pushes the pending amaxes into the histories (newest first), or drops them; pending is 0
  // afterwards.
  void commit();
  void discard();

  // The histories of layer l (kHead: the head), kRoles x kGemms rows of fp8_amax_history
  // entries, newest first, -1 where no step has been; what a checkpoint holds.
  int rows(int layer) const { return layer == kHead ? kRoles : kPerLayer; }
  std::vector<float> history(int layer) const;
  void set_history(int layer, const std::vector<float>& h);
  int H() const { return options_.history; }
  int begin() const { return begin_; }
  int end() const { return end_; }
  bool head() const { return head_; }

 private:
  int first(int layer) const { return layer == kHead ? (end_ - begin_) * kPerLayer : (layer - begin_) * kPerLayer; }
  Fp8Options options_;
  int begin_, end_;
  bool head_;
  std::vector<float> history_, pending_;
};

// The linear layers' GEMMs of one model chunk in FP8: its Fp8State, and scratch buffers in the
// arena for the quantized copies of a GEMM's input, weight and output gradient.
template <class Backend>
class Fp8Linear {
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

 public:
  // max_input, max_weight, max_grad: the most elements of any one GEMM's input, weight and
  // output gradient.
  // cp: the context-parallel communicator, or nullptr without it.
  Fp8Linear(const Fp8Options& options, int begin, int end, bool head, Comm* tp, Comm* cp,
            size_t max_input, size_t max_weight, size_t max_grad, Arena& arena);
  void bind();
  Fp8State& state() { return state_; }
  bool covers(int layer) const { return state_.covers(layer); }

  // Backend::matmul_forward and matmul_backward (backend/cpu/ops.hpp) on quantized inputs:
  // gemm is Fp8State::Gemm (0 for the head, layer Fp8State::kHead).
  void forward(int layer, int gemm, Act* out, const Act* inp, const Act* weight, const Act* bias,
               int N, int IC, int OC);
  void backward(int layer, int gemm, Act* dinp, float* dweight, float* dbias, const Act* dout,
                const Act* inp, const Act* weight, int N, int IC, int OC);

 private:
  const Act* quantize(Act* buffer, const Act* x, size_t n, int tensor, Fp8State::Role role);
  Fp8State state_;
  Comm *tp_, *cp_;
  Arena* arena_;
  size_t h_input_ = 0, h_weight_ = 0, h_grad_ = 0;
  Act *input_ = nullptr, *weight_ = nullptr, *grad_ = nullptr;
};

}  // namespace tessera
