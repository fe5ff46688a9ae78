#pragma once
// Walks one stage's schedule for one optimizer step: receives, forward and backward passes and
// sends, in the order the schedule lists them. Sends are non-blocking (their buffers stay
// untouched until completed), receives block; the schedule's simulation proves the order cannot
// deadlock.
#include <cstdint>
#include <vector>

#include "model/gpt.hpp"
#include "parallel/comm.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

struct MicroBatch {
  const int32_t* tokens = nullptr;   // (B,T)
  const int32_t* targets = nullptr;  // (B,T)
};

class PipelineExecutor {
 public:
  // pp: the pipeline communicator (ranks ordered by stage). The schedule's slots: max_in_flight.
  PipelineExecutor(Gpt& model, Comm* pp, std::vector<Action> schedule, int B, int T);

  int slots() const { return slots_; }

  // Runs every action of the step. dloss weights each position's loss. Returns the sum over this
  // stage's micro-batches of their mean loss (non-zero on the last stage only).
  // layer_done, if given, is passed to the step's last backward pass (see Gpt::backward).
  double run(const float* params, float* grads, const std::vector<MicroBatch>& batches,
             float dloss, const std::function<void(int layer)>& layer_done = {});

  // Forward passes only (evaluation): each micro-batch received, forwarded and sent on. Returns
  // the sum of the micro-batches' mean losses on the last stage, 0 elsewhere.
  double forward_only(const float* params, const std::vector<MicroBatch>& batches);

  // Seconds this stage spent blocked in receives during the last run(), and the run's length:
  // the measured pipeline bubble is their ratio.
  double wait_seconds() const { return wait_seconds_; }
  double run_seconds() const { return run_seconds_; }

 private:
  Gpt& model_;
  Comm* pp_;
  std::vector<Action> schedule_;
  int slots_, B_, T_;
  size_t activation_elems_;
  std::vector<MPI_Request> forward_sends_, backward_sends_;  // per slot
  std::vector<std::vector<float>> backward_buffers_;         // per slot
  double wait_seconds_ = 0, run_seconds_ = 0;

  double walk(const std::vector<Action>& actions, const float* params, float* grads,
              const std::vector<MicroBatch>& batches, float dloss,
              const std::function<void(int layer)>& layer_done);
};

// Slots a stage needs for its schedule (at least 1).
int schedule_slots(const std::vector<Action>& schedule);

}  // namespace tessera
