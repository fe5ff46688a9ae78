#pragma once
// Forward and backward of one rank's tile of the model: the embedding, the layers of its pipeline
// stage (blocks of the model's family, model/transformer_block.hpp), the final norm, the LM head
// and the loss, split Megatron-style over the tensor-parallel communicator, over the flat local
// parameter buffer. Activations of `slots` micro-batches live in one arena buffer, so a pipeline
// schedule can keep several micro-batches in flight. With tp = pp = 1 this is the whole model on
// one rank.
//
// Written once over a backend B (backend/backend.hpp): CpuBackend, or CudaBackend<float | bf16>.
// Parameters and activations are Backend::Act; parameter gradients, normalisation statistics and
// losses are fp32 whatever Act is.
//
// Activation memory (ModelOptions, model/options.hpp): each per-layer activation is either kept
// per slot and layer, or, when train.recompute says the backward recomputes it, lives in one
// layer's workspace shared by every slot and layer (the forward computes it there and moves on;
// the backward recomputes it there just before the layer's backward reads it). The same ops in
// the same order produce it both times, so recompute changes no bit of the result.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/arena.hpp"
#include "model/transformer_block.hpp"
#include "model/context_attention.hpp"
#include "model/fp8.hpp"
#include "model/options.hpp"
#include "model/shard.hpp"
#include "model/weights.hpp"

namespace tessera {

// data.document_mask's ids of a micro-batch (B,T each, backend memory; null without the mask):
// each token's document start (true positions under context parallelism), which the attention
// masks by, and its position in its document, which learned positions (GPT-2's wpe) read.
struct DocumentIds {
  const int32_t* start = nullptr;
  const int32_t* pos = nullptr;
};

template <class Backend>
class Gpt {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // Declares every activation and scratch buffer in `arena`; once the arena is allocated, bind()
  // takes the pointers (the engine allocates one arena for the model, optimizer and executor).
  // chunk: which of the layout's layer chunks this model runs (virtual stages; 0 without them).
  // cp: the context-parallel communicator (model/context_attention.hpp), nullptr or one rank
  // without it; with cp ranks max_seq is this rank's T / cp tokens of each sequence, chunks
  // r and 2 cp - 1 - r, at their true positions. ep: the expert-parallel communicator of the
  // MoE layers (model/moe_layer.hpp), nullptr or one rank without it.
  Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots, Arena& arena,
      const ModelOptions& options = {}, int chunk = 0, Comm* cp = nullptr, Comm* ep = nullptr);
  // The block keeps a pointer to layout_: not copied, not moved (engines hold it by pointer).
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  void bind();
  // The buffers every step overwrites before it reads them (activations, statistics, scratch,
  // the cross-entropy row maxima) filled with NaN in the CUDA emulator (Backend::poison): a
  // kernel that reads what the step did not write fails its comparison instead of reusing the
  // previous step's values.
  void poison_transient();

  // Stages after the first: the stage's input activations (B,T,C) of `slot`, filled by the
  // caller (received from the previous stage) before forward. Under sequence parallelism the
  // stage's input and output, and the gradients that cross stages, are this rank's B*T/tp rows:
  // boundary_elems() elements.
  Act* input(int slot) { return act(kEncoded, slot); }
  // Stages before the last: the output activations (B,T,C) after forward(slot).
  const Act* output(int slot) const;
  size_t boundary_elems() const { return size_t(max_n_ / seq_split()) * n_embd(); }

  // Gradients left partial on each tensor-parallel rank, as [begin, end) ranges of the local
  // buffer: those of layer l, or with l = -1 those outside the layers. Sequence parallelism's
  // norms' weights and biases (computed from this rank's rows only), and with tp > 1 always
  // model.qk_norm's q_norm and k_norm (computed from this rank's heads only). The engine sums
  // them over tp once per step, after the last backward; empty with neither.
  std::vector<std::pair<size_t, size_t>> tp_partial_gradients(int l) const;

  // tokens (B,T); targets (B,T) on the last stage, or nullptr for logits only; both in backend
  // memory. docs: under data.document_mask, on every stage, the micro-batch's document ids (kept
  // for the slot's backward). On the last stage with targets, losses (B*T, backend memory) receives each position's
  // cross-entropy; nothing waits for it (the engine reads a step's losses once, at its end). The
  // parameters come unit by unit from `weights` (model/weights.hpp).
  void forward(Weights<Act>& weights, int slot, const int32_t* tokens, const int32_t* targets,
               float* losses, int B, int T, DocumentIds docs = {});

  // Stages before the last: the gradient of the output (B,T,C), filled by the caller (received
  // from the next stage) before backward.
  Act* grad_output() { return scratch(Blk::kDRes); }
  // Adds the parameter gradients (fp32) of micro-batch `slot` to those `weights` hands out, unit
  // by unit; on the last stage each position's loss is weighted by dloss. Afterwards, on stages after the
  // first, grad_input() holds the gradient of the stage's input (B,T,C).
  // When layer_done is given, it is called with each layer's index as soon as that layer's
  // parameter gradients are complete (the data-parallel reduction of the step's last backward
  // starts there, while the layers below are still computing).
  void backward(Weights<Act>& weights, int slot, const int32_t* tokens, int B, int T,
                float dloss, const std::function<void(int layer)>& layer_done = {});
  const Act* grad_input() const { return scratch(Blk::kDRes); }

  // Last stage, after a forward without targets: this rank's logits (B*T, head_columns()), of
  // which the first vocab_valid() are real.
  const Act* logits(int slot) const { return act(kLogits, slot); }
  // The LM head's columns: this rank's real vocabulary rows, or all its rows, padding included,
  // where the backend's GEMMs want aligned leading dimensions (Backend::kAlignedHead).
  int head_columns() const {
    return Backend::kAlignedHead ? layout_.vocab_rows : layout_.vocab_valid();
  }

  // The activations and statistics of every slot, and the recompute workspace.
  size_t activation_bytes() const {
    return arena_->bytes(h_acts_) + arena_->bytes(h_stats_) + (moe_ ? moe_->activation_bytes() : 0);
  }
  // The chunk's MoE layers' routing over the step so far (nullptr without any); the engine reads
  // and clears them once per step.
  MoeLayer<Backend>* moe() { return moe_.get(); }
  const MoeLayer<Backend>* moe() const { return moe_.get(); }
  const LocalLayout& layout() const { return layout_; }
  // Seconds in context parallelism's attention so far (0 without it).
  double context_seconds() const { return context_ ? context_->seconds : 0; }
  // device.precision fp8: the delayed-scaling state of this chunk's FP8 GEMMs, else nullptr.
  Fp8State* fp8_state() { return fp8_ ? &fp8_->state() : nullptr; }
  Fp8Linear<Backend>* fp8() { return fp8_.get(); }
  // The step's FP8 amaxes from the device into fp8_state()'s pending ones (Fp8Linear::collect).
  void fp8_collect() {
    if (fp8_) fp8_->collect();
  }
  // The bytes of the FP8 weights' codes (0 without FP8).
  size_t fp8_weight_bytes() const { return fp8_ ? fp8_->weight_bytes() : 0; }
  // This chunk embeds the tokens (the model's first virtual stage) / ends in the loss (its last).
  bool first() const { return first_; }
  bool last() const { return last_; }
  int slots() const { return slots_; }

 private:
  using Blk = TransformerBlock<Backend>;
  // Per-slot activations (Act); per-layer kinds hold n_local_layers consecutive blocks: those of
  // TransformerBlock::Acts, then the final norm's output and the logits.
  // kQkRaw: model.qk_norm's q and k heads before their norm (empty without it).
  enum Slot {
    kEncoded, kNorm1, kQkv, kQkRaw, kAtt, kAttY, kAttProj, kRes2, kNorm2, kFc1, kMlpAct, kFc2,
    kOut, kNormF, kLogits, kSlotKinds
  };
  // Per-slot fp32 statistics; kAttLse (B,NH/tp,T) per layer with fused attention only (kAtt and
  // the probabilities' gradient are empty then). RMSNorm keeps no mean. kQkRstd: model.qk_norm's
  // rstd of each q and k head (empty without it).
  enum Stat {
    kNorm1Mean, kNorm1Rstd, kNorm2Mean, kNorm2Rstd, kAttLse, kQkRstd, kNormFMean, kNormFRstd,
    kStatKinds
  };

  // Where one layer's activations are for one micro-batch: kept ones in the slot, recomputed
  // ones in the workspace. `recomputing`: the layer's output too goes to the workspace (the kept
  // one may be in flight to the next stage; the values are the same).
  typename Blk::Acts layer_acts(int slot, int i, bool recomputing) const;
  // The units whose parameters a forward (or backward) pass of this chunk reads, in order.
  std::vector<int> pass_units(bool forward) const;
  int unit(int tensor) const { return layout_.unit_of_tensor[size_t(tensor)]; }
  // The token and position embedding of (B,T) tokens into out, and its backward: under context
  // parallelism chunk by chunk, each at its true positions.
  // doc_pos: each token's position in its document (data.document_mask), the row of positions
  // it reads; nullptr: its position in the sequence.
  void encode(Act* out, const int32_t* tokens, const Act* embed, const Act* positions, int B,
              int T, const int32_t* doc_pos);
  void encode_backward(float* dembed, float* dpositions, const Act* dout, const int32_t* tokens,
                       int B, int T, const int32_t* doc_pos);
  template <class F>
  void each_chunk(int B, int T, F f) const;
  // The rotary table of this rank's tokens into rope_ (model/transformer_block.hpp).
  void fill_rope_table();

  // Per-layer kinds kept (true) or recomputed (false) under this rank's options.
  bool kept(Slot s) const;
  bool kept(Stat s) const;

  // Sequence parallelism: the split of the B*T rows (tp, or 1 without it).
  int seq_split() const { return options_.sequence_parallel ? layout_.tp : 1; }
  int n_embd() const { return layout_.canonical.shape.n_embd; }
  Act* scratch(typename Blk::Scratch s) const { return block_.scratch(s); }
  void zero(Act* p, size_t n) const { Backend::zero(p, n * sizeof(Act)); }

  Act* act(Slot s, int slot, int layer = 0) const {
    return acts_ + slot * slot_stride_ + offset_[s] + size_t(layer) * size_[s];
  }
  float* stat(Stat s, int slot, int layer = 0) const {
    return stats_ + slot * stat_stride_ + stat_offset_[s] + size_t(layer) * stat_size_[s];
  }
  Act* work(Slot s) const { return acts_ + work_offset_[s]; }
  float* work(Stat s) const { return stats_ + stat_work_offset_[s]; }

  LocalLayout layout_;
  Comm* tp_;
  Arena* arena_;
  int max_n_, max_batch_;
  ModelOptions options_;  // sequence_parallel off with tp = 1
  Blk block_;             // the layers' ops, scratch, collectives, norm and linear layers
  int slots_;
  std::vector<DocumentIds> docs_;  // by slot: the forward's document ids
  int begin_, end_;  // this chunk's layers
  bool first_, last_;
  size_t offset_[kSlotKinds] = {}, size_[kSlotKinds] = {}, slot_stride_ = 0;
  size_t stat_offset_[kStatKinds] = {}, stat_size_[kStatKinds] = {}, stat_stride_ = 0;
  size_t work_offset_[kSlotKinds] = {}, stat_work_offset_[kStatKinds] = {};
  size_t h_acts_ = 0, h_stats_ = 0, h_scratch_ = 0, h_row_max_ = 0, h_sums_ = 0, h_targets_ = 0;
  size_t h_rope_ = 0;
  float* rope_ = nullptr;  // rotary positions: the table (T, hs/2, 2), by local token
  std::unique_ptr<ContextAttention<Backend>> context_;  // cp > 1
  std::unique_ptr<Fp8Linear<Backend>> fp8_;              // device.precision fp8
  std::unique_ptr<MoeLayer<Backend>> moe_;               // the chunk's MoE layers
  int cp_size_ = 1, cp_rank_ = 0;
  Act* acts_ = nullptr;
  float* stats_ = nullptr;
  float* row_max_ = nullptr;
  double* ce_sums_ = nullptr;   // (N,2) cross-entropy partial sums
  int32_t* targets_ = nullptr;  // (slots, N): the backward's targets of each slot
};

}  // namespace tessera
