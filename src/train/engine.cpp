#include "train/engine.hpp"

#include <algorithm>

#include "train/evaluate.hpp"

namespace tessera {

CpuEngine::CpuEngine(const EngineSetup& s)
    : tile_(s.tile), comms_{s.tp, s.dp, s.pp, s.embed}, mb_(s.micro_batch), T_(s.seq_len),
      zero_(s.zero), embed_sum_(s.embed_sum), optimizer_(s.tile, s.dp, s.world, s.zero, s.hyper),
      params_(optimizer_.buffer_size()), grads_(optimizer_.buffer_size()),
      model_(s.tile, s.tp, s.micro_batch, s.seq_len, schedule_slots(s.schedule)),
      executor_(model_, s.pp, s.schedule, s.micro_batch, s.seq_len) {}

TrainEngine::StepResult CpuEngine::train_step(const std::vector<MicroBatch>& batches, float dloss,
                                              double grad_clip, double lr, long t) {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  // Each layer's gradient is summed over dp as soon as the step's last backward finishes it.
  auto layer_done = [&](int l) {
    const LocalTensor& a = tile_.tensors[size_t(tile_.layer(l, LayerTensor(0)))];
    const LocalTensor& b = tile_.tensors[size_t(tile_.layer(l, kFcProjB))];
    optimizer_.start_reduce(grads_.data(), a.offset, b.offset + b.numel);
  };
  const double loss = executor_.run(params_.data(), grads_.data(), batches, dloss,
                                    zero_ ? std::function<void(int)>{} : layer_done);
  // The tied embedding: stage 0's wte and the last stage's copy see the sum of both gradients.
  if (embed_sum_ && tile_.wte >= 0) {
    const LocalTensor& wte = tile_.tensors[size_t(tile_.wte)];
    comms_[3]->all_reduce_sum(grads_.data() + wte.offset, wte.numel);
  }
  optimizer_.reduce_gradients(grads_.data());
  const double norm = optimizer_.grad_norm(grads_.data());
  optimizer_.step(params_.data(), grads_.data(), grad_clip > 0 ? clip_factor(norm, grad_clip) : 1.0,
                  lr, t);
  return {loss, norm};
}

double CpuEngine::eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                                uint64_t count) {
  return evaluate_loss_sum(executor_, params_.data(), file, mb_, T_, vocab, first, count);
}

double CpuEngine::payload_bytes(int c) const { return double(comms_[c]->payload_bytes); }

}  // namespace tessera
