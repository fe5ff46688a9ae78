#pragma once
// FP8 training (device.precision: fp8): the GEMMs of every linear layer take FP8 inputs with
// per-tensor delayed scaling, the recipe of NVIDIA's Transformer Engine ("FP8 Formats for Deep
// Learning", Micikevicius et al. 2022):
//
//   forward   out = dq(q(x, s_x)) · dq(q(w, s_w))ᵀ          x, w in E4M3
//   backward  dx = dq(q(g, s_g)) · dq(q(w, s_w))           g in E5M2 (fp8_format hybrid) or E4M3
//             dw = dq(q(g, s_g))ᵀ · dq(q(x, s_x))          db from the unquantized g
//
// q(t, s) is t·s in FP8 codes (rounded to nearest even, saturating, common/fp8_format.hpp), dq(c) the
// codes' values / s. A GEMM multiplies the codes' values (products exact in fp32), sums in fp32
// and multiplies the sum by 1/s of each operand: cuBLASLt's FP8 GEMM on a GPU (one-byte operands
// on the FP8 tensor cores, scales as device pointers), the same definition simulated on the CPU
// (backend/cpu/fp8.cpp). cuBLASLt takes its FP8 operands K-contiguous only ("TN"), so the
// backward's GEMMs read transposed copies: the output gradient is cast once into both layouts,
// the weight's transpose is cast beside it, the input is cast again transposed.
//
// Weights change only at the optimizer's step: each weight is cast (both layouts) at its first
// use in a step and read from those codes by every micro-batch and by the backward. The codes of
// inputs and output gradients live in scratch buffers, cast per GEMM. Each cast also folds the
// tensor's amax into a device slot, read once per step (Fp8Linear::collect): no host read per GEMM.
//
// Each FP8 tensor (per layer: the inputs, the weights and the output gradients of its four GEMMs,
// qkv, proj, fc1 (LLaMA: gate and up together), fc2; the LM head's three with fp8_head) has an
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
//
// A mixture-of-experts layer (model/moe_layer.hpp): its attention's GEMMs and its shared experts'
// (the dense MLP's kFc1 and kFc2 rows) are the layer's 12 tensors; its routed experts' fc1 and fc2
// run FP8 too, with tensors of their own after the head's: per MoE layer and expert GEMM (fc1,
// fc2) the dispatched rows' input and output gradient, one scale each for all the layer's experts
// (the rows the held experts compute), and each expert's weight, one scale per expert (the same
// on every rank holding it under parallel.ep: it is that expert's). The dispatched rows have no
// layout-free current amax: under ep a rank's rows come from the micro-batches of several
// data-parallel ranks, which one rank computes one at a time, so a first step's scale from them
// would differ by layout. So the experts' GEMMs of a step without their histories (the first of
// a run, or one restarted from a checkpoint without FP8 state) run in the compute type and only
// record the amaxes; from the next step on they run on codes at the delayed scales, which the
// step-end reduction over tp, cp and dp makes the same on every layout. The router's GEMM stays
// in the compute type (bf16 on a GPU, fp32 on the CPU), as Transformer Engine's and Megatron's
// FP8 keep it: its top-k choice is discontinuous in the logits, and it is a small GEMM.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/arena.hpp"
#include "common/fp8_format.hpp"
#include "model/options.hpp"

namespace tessera {

class Fp8State {
 public:
  enum Gemm { kQkv, kProj, kFc1, kFc2, kGemms };  // model/cost.hpp: a layer's linear layers
  enum Role { kInput, kWeight, kGrad, kRoles };
  static constexpr int kHead = -1;  // the layer index of the LM head's GEMM
  static constexpr int kPerLayer = int(kGemms) * int(kRoles);

  // The layers [begin, end) of a model chunk, and the LM head where `head`; `moe`: those of them
  // that are MoE layers, of `experts` experts each.
  Fp8State(const Fp8Options& options, int begin, int end, bool head,
           std::vector<int> moe = {}, int experts = 0);

  bool covers(int layer) const { return layer == kHead ? head_ : layer >= begin_ && layer < end_; }
  // A tensor's index in the state.
  int tensor(int layer, int gemm, Role role) const;
  // MoE layer `layer`'s routed experts (gemm kFc1 or kFc2): the dispatched rows' input or output
  // gradient (expert ignored), or expert `expert`'s weight (of all the layer's experts).
  int expert_tensor(int layer, int gemm, Role role, int expert) const;
  int expert_tensor_begin() const { return experts_at_; }
  Role role(int i) const;
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
  // afterwards. Either ends a step: the generation counts them (the weights may have changed).
  void commit();
  void discard();
  long generation() const { return generation_; }
  int tensors() const { return int(pending_.size()); }

  // The histories of layer l (kHead: the head), kRoles x kGemms rows of fp8_amax_history
  // entries, newest first, -1 where no step has been; what a checkpoint holds. With `experts`,
  // MoE layer l's routed experts' rows instead: expert_rows() of them, per GEMM (fc1, fc2) the
  // input's, the output gradient's, then each expert's weight's.
  int rows(int layer, bool experts = false) const {
    return experts ? expert_rows() : layer == kHead ? kRoles : kPerLayer;
  }
  std::vector<float> history(int layer, bool experts = false) const;
  void set_history(int layer, const std::vector<float>& h, bool experts = false);
  // An MoE layer's routed experts' rows, and the checkpoint's table of a model's: every layer's
  // 12, the head's 3, then each MoE layer's expert rows (`moe_layers` of `experts` experts).
  int expert_rows() const { return expert_rows(experts_); }
  static int expert_rows(int experts) { return 2 * (2 + experts); }
  static size_t table_rows(int n_layer, int moe_layers, int experts) {
    return size_t(n_layer) * kPerLayer + kRoles + size_t(moe_layers) * expert_rows(experts);
  }
  const std::vector<int>& moe() const { return moe_; }
  int H() const { return options_.history; }
  int begin() const { return begin_; }
  int end() const { return end_; }
  bool head() const { return head_; }
  const Fp8Options& options() const { return options_; }

 private:
  int first(int layer) const { return layer == kHead ? (end_ - begin_) * kPerLayer : (layer - begin_) * kPerLayer; }
  int first_expert(int layer) const;
  Fp8Options options_;
  int begin_, end_;
  bool head_;
  std::vector<int> moe_;
  int experts_ = 0, experts_at_ = 0;  // the first expert tensor's index
  std::vector<float> history_, pending_;
  long generation_ = 0;
};

// The elements of the largest input and output gradient of a chunk's FP8 GEMMs, and of each
// GEMM's weight (Fp8State::Gemm order; `head`: the LM head's, 0 without it).
struct Fp8Sizes {
  size_t input = 0, grad = 0;
  size_t weight[Fp8State::kGemms] = {};
  size_t head = 0;
};

// A chunk's MoE layers' routed experts in FP8: the layers, their experts, the `held` of them this
// rank computes (experts [first, first + held) under parallel.ep), the elements of one expert's
// fc1 and fc2 weights (this rank's tp part).
struct Fp8Experts {
  std::vector<int> layers;
  int experts = 0, held = 0, first = 0;
  size_t fc1 = 0, fc2 = 0;
};

// The linear layers' GEMMs of one model chunk in FP8: its Fp8State; in the arena, the codes of
// every weight (and transpose), scratch codes for a GEMM's input and output gradient, and the
// device slots of every tensor's amax and scale. A weight's codes are cast once a step and kept
// until the step ends; under ZeRO-3 (Fp8Options::layer_codes), whose parameters exist whole only
// while their layer computes, the layers' codes take turns in two layers' places instead (the
// head keeps its own): cast again whenever their place held another layer's since, the same
// codes from the same gathered weight, for 2 bytes a parameter of two layers, not of the chunk.
// With resharding the layers' weights come gathered as codes (cast_part on each rank, use_codes):
// their place is then filled from those codes (Backend::fp8_place) instead of a cast. The routed
// experts' weights (gathered as values, in units of their own) have places of their own per MoE
// layer and held expert, under layer_codes two MoE layers' taking turns.
template <class Backend>
class Fp8Linear {
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

 public:
  // cp: the context-parallel communicator, or nullptr without it. `experts`: the chunk's MoE
  // layers' routed experts (none: their GEMMs are not FP8's).
  Fp8Linear(const Fp8Options& options, int begin, int end, bool head, Comm* tp, Comm* cp,
            const Fp8Sizes& sizes, Arena& arena, const Fp8Experts& experts = {});
  void bind();
  Fp8State& state() { return state_; }
  bool covers(int layer) const { return state_.covers(layer); }
  // The bytes of the weights' codes (both layouts), for the memory report.
  size_t weight_bytes() const { return arena_->bytes(h_weights_); }

  // Backend::matmul_forward and matmul_backward (backend/cpu/ops.hpp) on FP8 codes: gemm is
  // Fp8State::Gemm (0 for the head, layer Fp8State::kHead).
  void forward(int layer, int gemm, Act* out, const Act* inp, const Act* weight, const Act* bias,
               int N, int IC, int OC);
  void backward(int layer, int gemm, Act* dinp, float* dweight, float* dbias, const Act* dout,
                const Act* inp, const Act* weight, int N, int IC, int OC);
  // The step's amaxes from the device slots into the state's pending ones; the slots restart at 0.
  void collect();

  // MoE layer `layer`'s routed experts (gemm kFc1 or kFc2), each held expert (0 .. held - 1) on
  // its block of the dispatched rows, as forward and backward: on codes where the layer's
  // experts have histories (experts_fp8), else in the compute type recording the amaxes. Before
  // the blocks of a pass, expert_rows gives all the rows of a role this rank computes (x, n
  // elements), whose amax such a step records.
  bool experts_fp8(int layer) const;
  void expert_rows(int layer, int gemm, Fp8State::Role role, const Act* x, size_t n);
  // A held expert's weight (OC,IC): its codes, cast once a step (nullptr in a step in the
  // compute type); either folds its amax into the step's. Called for an expert given no rows
  // too, so that its history does not run out while the router passes it by.
  const uint8_t* expert_weight(int layer, int gemm, int expert, const Act* weight, int OC, int IC);
  void expert_forward(int layer, int gemm, int expert, Act* out, const Act* inp,
                      const Act* weight, const Act* bias, int N, int IC, int OC);
  void expert_backward(int layer, int gemm, int expert, Act* dinp, float* dweight, float* dbias,
                       const Act* dout, const Act* inp, const Act* weight, int N, int IC, int OC);

  // ZeRO-3 (CodesUnit, model/shard.hpp): the weight of layer's `gemm` gathered as codes. Each rank
  // casts its part, n elements of x, into out with the weight's scale of the step (the first
  // step: the amax of the parts reduced over the shard group, tp and cp, as a whole weight's is
  // over tp and cp), folding the part's amax into the step's (the engine reduces it over dp).
  void cast_part(int layer, int gemm, const Act* x, size_t n, uint8_t* out, Comm* shard);
  // Layer `layer`'s weights, laid out from `params`, come as the gathered codes laid out from
  // `codes` (null: as values): its GEMMs place them (Backend::fp8_place) instead of casting.
  void use_codes(int layer, const Act* params, const uint8_t* codes) {
    codes_layer_ = layer;
    codes_params_ = params;
    codes_ = codes;
  }

 private:
  float scale(const Act* x, size_t n, int tensor);
  // A first step's amax of this rank's piece reduced over the shard group (null: none), tp and
  // cp (with `cp`): the whole tensor's, the same on every rank holding part of it.
  float tile_amax(float amax, Comm* shard = nullptr, bool cp = true);
  // The GEMMs on the codes of input tensor x, weight tensor w (codes qw) and gradient tensor g.
  void gemm_forward(int x, int w, const uint8_t* qw, Act* out, const Act* inp, const Act* bias,
                    int N, int IC, int OC);
  void gemm_backward(int x, int w, int g, const uint8_t* qw, Act* dinp, float* dweight,
                     float* dbias, const Act* dout, const Act* inp, int N, int IC, int OC);
  // The codes of weight tensor `tensor` in place `at`, cast from `weight` unless they stand.
  uint8_t* cast_weight(size_t at, int tensor, const Act* weight, int OC, int IC);
  void cast(uint8_t* out, uint8_t* out_t, const Act* x, int rows, int cols, int tensor,
            Fp8State::Role role);
  // Each tensor's 1/scale in a 16-byte slot of its own: cuBLASLt wants every pointer it is given
  // 16-byte aligned, and may refuse a scale pointer that is not.
  static constexpr size_t kScaleSlot = 16 / sizeof(float);
  // The amaxes, one float each, then the scales from a 16-byte boundary.
  size_t amax_slots() const {
    return (size_t(state_.tensors()) + kScaleSlot - 1) / kScaleSlot * kScaleSlot;
  }
  float* scale_inv(int tensor) const { return scale_inv_ + kScaleSlot * size_t(tensor); }
  Fp8Operand operand(const uint8_t* codes, int tensor, Fp8State::Role role) const {
    return {codes, state_.format(role), scale_inv(tensor)};
  }
  const uint8_t* weight_codes(int layer, int gemm, const Act* weight, int OC, int IC);

  Fp8State state_;
  Comm *tp_, *cp_;
  Arena* arena_;
  size_t h_slots_ = 0, h_weights_ = 0, h_input_ = 0, h_grad_ = 0, h_grad_t_ = 0;
  float *amax_ = nullptr, *scale_inv_ = nullptr;
  uint8_t *weights_ = nullptr, *input_ = nullptr, *grad_ = nullptr, *grad_t_ = nullptr;
  // Per place of codes (place(), then the experts' expert_place()): where its codes start; the
  // weight's tensor, generation and shape they were cast from (-1: never).
  size_t place(int layer, int gemm, int weight) const;
  size_t expert_place(int layer, int gemm, int expert) const;
  std::vector<size_t> weight_at_;
  struct Cast {
    int weight = -1;
    long generation = -1;
    int rows = 0, cols = 0;
  };
  std::vector<Cast> cast_;
  int codes_layer_ = -1;
  const Act* codes_params_ = nullptr;
  const uint8_t* codes_ = nullptr;
  std::vector<float> part_scale_;  // by tensor: the scale cast_part used this step
  Fp8Experts experts_;
  size_t expert_places_ = 0;  // the first expert place
};

}  // namespace tessera
