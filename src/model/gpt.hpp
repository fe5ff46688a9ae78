#pragma once
// Forward and backward of one rank's tile of the GPT-2 model: the layers of its pipeline stage,
// split Megatron-style over the tensor-parallel communicator, over the flat local parameter
// buffer. Activations of `slots` micro-batches live in one allocation, so a pipeline schedule can
// keep several micro-batches in flight. With tp = pp = 1 this is the whole model on one rank.
#include <cstdint>
#include <functional>
#include <vector>

#include "model/shard.hpp"
#include "parallel/comm.hpp"

namespace tessera {

class Gpt {
 public:
  Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots);

  // Stages after the first: the stage's input activations (B,T,C) of `slot`, filled by the
  // caller (received from the previous stage) before forward.
  float* input(int slot) { return act(kEncoded, slot); }
  // Stages before the last: the output activations (B,T,C) after forward(slot).
  const float* output(int slot) const;

  // tokens (B,T); targets (B,T) on the last stage, or nullptr for logits only. On the last stage
  // with targets, returns the mean cross-entropy over the B*T positions; otherwise 0.
  double forward(const float* params, int slot, const int32_t* tokens, const int32_t* targets,
                 int B, int T);

  // Stages before the last: the gradient of the output (B,T,C), filled by the caller (received
  // from the next stage) before backward.
  float* grad_output() { return scratch(kDRes); }
  // Accumulates parameter gradients of micro-batch `slot` into grads; on the last stage each
  // position's loss is weighted by dloss. Afterwards, on stages after the first, grad_input()
  // holds the gradient of the stage's input (B,T,C).
  // When layer_done is given, it is called with each layer's index as soon as that layer's
  // parameter gradients are complete (the data-parallel reduction of the step's last backward
  // starts there, while the layers below are still computing).
  void backward(const float* params, float* grads, int slot, const int32_t* tokens, int B, int T,
                float dloss, const std::function<void(int layer)>& layer_done = {});
  const float* grad_input() const { return scratch(kDRes); }

  // Last stage, after a forward without targets: this rank's logits (B*T, vocab_valid()).
  const float* logits(int slot) const { return act(kLogits, slot); }

  size_t activation_bytes() const { return acts_.size() * sizeof(float); }
  const LocalLayout& layout() const { return layout_; }

 private:
  // Per-slot activations; per-layer kinds hold n_local_layers consecutive blocks.
  enum Slot {
    kEncoded, kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtt, kAttY, kAttProj, kRes2, kLn2, kLn2Mean,
    kLn2Rstd, kFcH, kFcGelu, kFcProj, kRes3, kLnF, kLnFMean, kLnFRstd, kLogits, kLosses,
    kSlotKinds
  };
  // Backward scratch, one set shared by all slots and layers.
  enum Scratch { kDRes, kDLn, kDQkv, kDAtt, kDAttY, kDFcH, kDFcGelu, kRowMax, kScratchKinds };

  float* act(Slot s, int slot, int layer = 0) {
    return acts_.data() + slot * slot_stride_ + offset_[s] + size_t(layer) * size_[s];
  }
  const float* act(Slot s, int slot, int layer = 0) const {
    return acts_.data() + slot * slot_stride_ + offset_[s] + size_t(layer) * size_[s];
  }
  float* scratch(Scratch s) { return scratch_.data() + scratch_offset_[s]; }
  const float* scratch(Scratch s) const { return scratch_.data() + scratch_offset_[s]; }

  LocalLayout layout_;
  Comm* tp_;
  size_t offset_[kSlotKinds] = {}, size_[kSlotKinds] = {}, slot_stride_ = 0;
  size_t scratch_offset_[kScratchKinds] = {};
  std::vector<float> acts_, scratch_;
  std::vector<double> ce_sums_;            // (N,2) cross-entropy partial sums
  std::vector<std::vector<int32_t>> targets_;  // per slot
};

}  // namespace tessera
