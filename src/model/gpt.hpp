#pragma once
// Forward and backward of the GPT-2 model on one rank, over the flat parameter buffer.
// Activations live in one allocation sized for (max_batch, max_seq); each call may use less.
#include <cstdint>
#include <vector>

#include "model/param_layout.hpp"

namespace tessera {

class Gpt {
 public:
  Gpt(const ParamLayout& layout, int max_batch, int max_seq);

  // tokens, targets (B,T). Keeps what backward needs. With targets, returns the mean cross-entropy
  // over the B*T positions; without (targets == nullptr) returns 0 and leaves the logits.
  double forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T);

  // Accumulates d(dloss * sum of per-position losses)/d(params) into grads, for the batch of the
  // last forward (which must have had targets).
  void backward(const float* params, float* grads, const int32_t* tokens, int B, int T, float dloss);

  // After a forward without targets: logits (B*T, V) over the real vocabulary.
  const float* logits() const { return act(kLogits); }

  size_t activation_bytes() const { return acts_.size() * sizeof(float); }
  const ParamLayout& layout() const { return layout_; }

 private:
  // One slot per activation kind; per-layer kinds hold n_layer consecutive blocks.
  enum Slot {
    kEncoded, kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtt, kAttY, kAttProj, kRes2, kLn2, kLn2Mean,
    kLn2Rstd, kFcH, kFcGelu, kFcProj, kRes3, kLnF, kLnFMean, kLnFRstd, kLogits, kLosses,
    // backward scratch, reused by every layer
    kDRes, kDLn, kDQkv, kDAtt, kDAttY, kDFcH, kDFcGelu, kSlotCount
  };
  float* act(Slot s, int layer = 0) { return acts_.data() + slot_offset_[s] + layer * slot_size_[s]; }
  const float* act(Slot s, int layer = 0) const {
    return acts_.data() + slot_offset_[s] + layer * slot_size_[s];
  }

  ParamLayout layout_;
  int max_batch_, max_seq_;
  size_t slot_offset_[kSlotCount] = {};
  size_t slot_size_[kSlotCount] = {};
  std::vector<float> acts_;
  std::vector<int32_t> targets_;
};

}  // namespace tessera
