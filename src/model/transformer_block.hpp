#pragma once
// One transformer block of the model's family (model/family.hpp) on this rank, forward and
// backward, op per line: norm, attention (q, k, v; rotary positions where the family has them;
// the core; the output projection), residual add, norm, MLP, residual add, each piece's ops chosen
// by its kind. Megatron's tensor parallelism: q/k/v and fc1 column-parallel, the output projection
// and fc2 row-parallel, the partial products summed over tp once per section; under sequence
// parallelism the norms' outputs all-gathered before the column-parallel GEMMs and the row-parallel
// products reduce-scattered into this rank's rows. The linear layers run at the shapes of the
// family's GEMMs (model/cost.hpp), the ones the planner prices.
//
// The stage (model/gpt.hpp) owns the buffers: it hands each layer its activations (Acts: kept per
// micro-batch, or in the recompute workspace) and declares the scratch set sized here; it shares
// the block's scratch, collectives, norm and (FP8-aware) linear layers for its embedding and head.
#include <cstddef>

#include "backend/op_clock.hpp"
#include "model/context_attention.hpp"
#include "model/cost.hpp"
#include "model/fp8.hpp"
#include "model/moe_layer.hpp"
#include "model/options.hpp"
#include "model/shard.hpp"

namespace tessera {

template <class Backend>
class TransformerBlock {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // Scratch (Act), one set shared by all slots and layers: the gradients of the residual stream
  // (kDRes, this rank's rows), of a norm's output (kDNorm, all N rows: a column-parallel GEMM's
  // partial input gradient), of q/k/v, of the attention's probabilities and output, of fc1's
  // output and of the MLP's activation. Under sequence parallelism: kGather (N,C) an all-gathered
  // norm output, kPartial (N,C) a row-parallel product before its reduce-scatter, kDFull (N,C)
  // the all-gathered gradient of the residual stream, kDNormRows this rank's rows of kDNorm.
  enum Scratch {
    kDRes, kDNorm, kDQkv, kDAtt, kDAttY, kDFc1, kDMlpAct, kGather, kPartial, kDFull, kDNormRows,
    kScratchKinds
  };

  // Where one layer's activations are for one micro-batch: its input (the residual stream), the
  // norms' outputs, q/k/v, the attention's probabilities (not with fused attention) and output,
  // the output projection's, the residual stream after the attention (res2), fc1's output, the
  // MLP's activation, fc2's, and the layer's output; the norms' statistics (RMSNorm: rstd only)
  // and, with fused attention, each row's log-sum-exp.
  struct Acts {
    const Act* in;
    Act *norm1, *qkv, *att, *atty, *attproj, *res2, *norm2, *fc1, *mlp_act, *fc2, *out;
    float *norm1_mean, *norm1_rstd, *norm2_mean, *norm2_rstd, *lse;
    // model.qk_norm: the q and k heads before their norm (N, (nh + nkv) hs) and each head's rstd
    // (N, nh + nkv); nullptr without it.
    Act* qk_raw;
    float* qk_rstd;
    // data.document_mask: each token's document start (B,T; true positions under context
    // parallelism), which the attention masks by; nullptr without.
    const int32_t* doc_start;
    int slot;          // the micro-batch's slot: an MoE layer keeps its own activations by it
    bool recomputing;  // a rerun of the forward (full recompute): the MoE stats not counted again
  };

  // max_batch x max_seq: the most rows of a micro-batch. options.sequence_parallel as the stage
  // runs it (off with tp = 1).
  TransformerBlock(const LocalLayout& layout, const ModelOptions& options, Comm* tp, int max_batch,
        int max_seq);
  // The scratch set's elements, for the stage to declare.
  size_t scratch_elems() const { return scratch_total_; }
  // Once the arena is allocated: the scratch set; the rotary table (T, hs/2, 2) by local token
  // (nullptr without rotary positions); the chunk's context-parallel attention and FP8 GEMMs
  // (nullptr without).
  void bind(Act* scratch, const float* rope, ContextAttention<Backend>* context,
            Fp8Linear<Backend>* fp8, MoeLayer<Backend>* moe);
  // The weight of the current micro-batch's mean loss in the objective (Gpt::backward's dloss
  // times its tokens): the MoE layers' balancing losses are scaled by it.
  void set_loss_weight(double w) { loss_weight_ = w; }

  const BlockCost& cost() const { return cost_; }
  const BlockWidths& width() const { return cost_.width; }

  // A layer's parameters and gradients as Weights hands them out (model/weights.hpp): its unit,
  // and its experts' unit where they are one of their own (LocalLayout::expert_unit), else null.
  struct LayerUnits {
    const Act* params = nullptr;
    float* grads = nullptr;  // null for the forward
    const Act* expert_params = nullptr;
    float* expert_grads = nullptr;
    // ZeRO-3 with FP8: the layer's GEMM weights as their gathered codes, laid out as params
    // (Weights::codes), or null.
    const uint8_t* codes = nullptr;
  };
  // Layer l from a.in to a.out.
  void forward(const LayerUnits& u, int l, const Acts& a, int B, int T);
  // Its backward from kDRes (the gradient of its output, this rank's rows), which it leaves
  // holding the gradient of its input; adds its parameter gradients (fp32) to u's grads.
  void backward(const LayerUnits& u, int l, const Acts& a, int B, int T);
  // The attention core alone (selective recompute reruns it before the backward).
  void attention_core(const Acts& a, int B, int T);

  // The norm piece over `rows` rows of C: LayerNorm (mean and rstd kept) or RMSNorm (rstd kept,
  // no bias).
  void norm_forward(Act* out, float* mean, float* rstd, const Act* in, const Act* weight,
                    const Act* bias, int rows);
  void norm_backward(Act* din, float* dweight, float* dbias, const Act* dout, const Act* in,
                     const Act* weight, const float* mean, const float* rstd, int rows);
  // Backend::matmul_forward / matmul_backward, or their FP8 form (model/fp8.hpp) where the
  // chunk's GEMM `gemm` (Fp8State::Gemm) of `layer` (Fp8State::kHead: the LM head) is in FP8.
  void linear_forward(int layer, int gemm, Act* out, const Act* in, const Act* weight,
                      const Act* bias, int N, int IC, int OC) {
    op_clock::set_gemm(gemm_slot(layer, gemm));
    if (fp8_ && fp8_->covers(layer))
      fp8_->forward(layer, gemm, out, in, weight, bias, N, IC, OC);
    else
      Backend::matmul_forward(out, in, weight, bias, N, IC, OC);
  }
  void linear_backward(int layer, int gemm, Act* din, float* dweight, float* dbias,
                       const Act* dout, const Act* in, const Act* weight, int N, int IC, int OC) {
    op_clock::set_gemm(gemm_slot(layer, gemm));
    if (fp8_ && fp8_->covers(layer))
      fp8_->backward(layer, gemm, din, dweight, dbias, dout, in, weight, N, IC, OC);
    else
      Backend::matmul_backward(din, dweight, dbias, dout, in, weight, N, IC, OC);
  }
  // The step breakdown's slot of layer's linear layer `gemm` (Fp8State::Gemm; the head's: kHead).
  static op_clock::Slot gemm_slot(int layer, int gemm) {
    return layer == Fp8State::kHead ? op_clock::kHead : op_clock::linear_slot(gemm);
  }
  // A norm output of this rank's rows as the (N,C) a column-parallel GEMM reads: all-gathered
  // into `full`, or the argument itself without sequence parallelism.
  const Act* gather_rows(const Act* rows, Act* full, int N);
  // A row-parallel GEMM's (N,C) partial product summed over tp into this rank's rows: reduced in
  // place (and returned), or reduce-scattered into `rows`.
  Act* reduce_rows(Act* partial, Act* rows, int N);
  Act* scratch(Scratch s) const { return scratch_ + scratch_offset_[s]; }
  void zero(Act* p, size_t n) const { Backend::zero(p, n * sizeof(Act)); }

 private:
  // One layer's parameters by role, nullptr where the family has none (LLaMA's biases), and
  // their gradients where asked.
  struct Params {
    const Act* p[kLayerRoles];
    float* g[kLayerRoles];
  };
  Params params_of(const LayerUnits& u, int l) const;
  // Layer l's linear layer `gemm` at its shape in the family's cost (N rows).
  void linear_forward(int l, int gemm, Act* out, const Act* in, const Act* weight,
                      const Act* bias, int N) {
    const LinearGemm& g = cost_.gemms[size_t(gemm)];
    linear_forward(l, gemm, out, in, weight, bias, N, g.in, g.out);
  }
  void linear_backward(int l, int gemm, Act* din, float* dweight, float* dbias, const Act* dout,
                       const Act* in, const Act* weight, int N) {
    const LinearGemm& g = cost_.gemms[size_t(gemm)];
    linear_backward(l, gemm, din, dweight, dbias, dout, in, weight, N, g.in, g.out);
  }
  // The pieces between a norm and the row-parallel reduction that ends their section: from the
  // gathered norm output to the (N,C) partial product `out`, and back from kDRes to kDNorm.
  void attention_forward(int l, Act* out, const Act* x, const Params& w, const Acts& a, int B,
                         int T);
  void attention_backward(int l, const Params& w, const Acts& a, int B, int T);
  void mlp_forward(int l, Act* out, const Act* x, const Params& w, const Acts& a, int N);
  void mlp_backward(int l, const Params& w, const Acts& a, int N);
  typename MoeLayer<Backend>::Params moe_params(const Params& w) const;

  // Sequence parallelism: the split of the B*T rows (tp, or 1 without it).
  int seq_split() const { return options_.sequence_parallel ? layout_->tp : 1; }
  // Layer l routes this rank's own rows through whole experts (parallel.expert_tp = 1).
  bool own_rows(int l) const { return moe_ && moe_->routed(l) && moe_->own_rows(); }
  int n_embd() const { return layout_->canonical.shape.n_embd; }

  const LocalLayout* layout_;
  const Family* family_;
  BlockCost cost_;
  ModelOptions options_;
  Comm* tp_;
  size_t scratch_offset_[kScratchKinds] = {}, scratch_total_ = 0;
  Act* scratch_ = nullptr;
  const float* rope_ = nullptr;
  ContextAttention<Backend>* context_ = nullptr;
  Fp8Linear<Backend>* fp8_ = nullptr;
  MoeLayer<Backend>* moe_ = nullptr;
  double loss_weight_ = 1;
};

}  // namespace tessera
