#pragma once
// The GPU twin of model/gpt.hpp (CUDA builds only): the same forward and backward of one rank's
// tile, call for call, with the cuda:: ops on device buffers and the tensor-parallel sums over
// NCCL on the backend's stream. F is float (fp32 throughout, for parity with the CPU) or bf16
// (parameters and activations bf16; parameter gradients, LayerNorm statistics and losses fp32).
//
// The trainer's CUDA path (train/engine_cuda.cpp) runs it through PipelineExecutorCuda;
// tests/gpu/test_model.cpp trains it against the CPU Gpt.
#include <cstdint>
#include <functional>
#include <vector>

#include "device/arena.hpp"
#include "device/nccl_comm.hpp"
#include "model/shard.hpp"

namespace tessera {

template <typename F>
class GptCuda {
 public:
  // Declares every activation and scratch buffer in `arena` (the caller allocates the arena once,
  // after every user has declared its buffers, then calls bind()).
  GptCuda(const LocalLayout& layout, device::NcclComm* tp, int max_batch, int max_seq, int slots,
          device::DeviceArena& arena);
  void bind();  // takes the pointers from the allocated arena

  F* input(int slot) { return act(kEncoded, slot); }
  const F* output(int slot) const;

  // As Gpt::forward; params, tokens and targets are device pointers. The mean loss comes back
  // to the host (a synchronisation, on the last stage with targets only).
  double forward(const F* params, int slot, const int32_t* tokens, const int32_t* targets, int B,
                 int T);
  F* grad_output() { return scratch(kDRes); }
  // As Gpt::backward; grads (fp32, the layout's offsets) accumulate.
  void backward(const F* params, float* grads, int slot, const int32_t* tokens, int B, int T,
                float dloss, const std::function<void(int layer)>& layer_done = {});
  const F* grad_input() const { return scratch(kDRes); }
  const F* logits(int slot) const { return act(kLogits, slot); }

  size_t activation_bytes() const { return arena_->bytes(h_acts_); }
  const LocalLayout& layout() const { return layout_; }

 private:
  enum Slot {
    kEncoded, kLn1, kQkv, kAtt, kAttY, kAttProj, kRes2, kLn2, kFcH, kFcGelu, kFcProj, kRes3, kLnF,
    kLogits, kSlotKinds
  };
  // fp32 per-slot statistics
  enum Stat { kLn1Mean, kLn1Rstd, kLn2Mean, kLn2Rstd, kLnFMean, kLnFRstd, kLosses, kStatKinds };
  enum Scratch { kDRes, kDLn, kDQkv, kDAtt, kDAttY, kDFcH, kDFcGelu, kScratchKinds };

  F* act(Slot s, int slot, int layer = 0) const {
    return acts_ + slot * slot_stride_ + offset_[s] + size_t(layer) * size_[s];
  }
  float* stat(Stat s, int slot, int layer = 0) const {
    return stats_ + slot * stat_stride_ + stat_offset_[s] + size_t(layer) * stat_size_[s];
  }
  F* scratch(Scratch s) const { return scratch_ + scratch_offset_[s]; }
  void zero(F* p, size_t n) const;

  LocalLayout layout_;
  device::NcclComm* tp_;
  device::DeviceArena* arena_;
  int max_n_;
  size_t offset_[kSlotKinds] = {}, size_[kSlotKinds] = {}, slot_stride_ = 0;
  size_t stat_offset_[kStatKinds] = {}, stat_size_[kStatKinds] = {}, stat_stride_ = 0;
  size_t scratch_offset_[kScratchKinds] = {};
  size_t h_acts_ = 0, h_stats_ = 0, h_scratch_ = 0, h_row_max_ = 0, h_sums_ = 0, h_targets_ = 0;
  F* acts_ = nullptr;
  float* stats_ = nullptr;
  F* scratch_ = nullptr;
  float* row_max_ = nullptr;
  double* ce_sums_ = nullptr;   // (N,2)
  int32_t* targets_ = nullptr;  // (slots, N)
  std::vector<float> host_losses_;
};

}  // namespace tessera
