#pragma once
// Walks one stage's schedule for one optimizer step: receives, forward and backward passes and
// sends, in the order the schedule lists them, over a backend B (backend/backend.hpp).
//
// Every run of consecutive transfers in the schedule is one group (transfer_groups in
// schedule.hpp): posted together, complete together. That is what NCCL needs, where a send holds
// its stream until the peer posts the receive, so a lone send where the neighbour is sending back
// (1F1B's steady state) would deadlock; simulate_grouped and the unit tests check that every
// generated schedule completes that way. MPI (the CPU) keeps a send going past its group: its
// buffer is waited for before it is overwritten. Messages between two stages match in order
// (NCCL has no tags): each stage sends and receives each kind in its neighbour's micro-batch
// order, which `simulate` checks too.
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/arena.hpp"
#include "model/gpt.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

// A micro-batch's tokens and targets (B,T), and where its per-position losses (B*T) go on the
// last stage, in the backend's memory; under data.document_mask its document ids, on every
// stage (Gpt::forward).
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  float* losses = nullptr;
  DocumentIds docs = {};
};

template <class Backend>
class PipelineExecutor {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // models: this stage's chunks, models[c] running the schedule's chunk c (one without virtual
  // stages), each with max_in_flight(schedule, c) slots (schedule_slots). pp: the pipeline
  // communicator (ranks ordered by stage). Declares its send buffers in `arena`; bind() once the
  // arena is allocated.
  PipelineExecutor(std::vector<Gpt<Backend>*> models, Comm* pp, std::vector<Action> schedule,
                   int B, int T, Arena& arena);
  void bind();

  // Runs every action of the step, the chunks reading their parameters from and adding their
  // gradients to `weights` (model/weights.hpp). dloss weights each position's loss; the last
  // stage writes every micro-batch's losses. layer_done, if given, is passed to each chunk's last
  // backward pass of the step (see Gpt::backward).
  void run(Weights<Act>& weights, const std::vector<MicroBatch>& batches, float dloss,
           const std::function<void(int layer)>& layer_done = {});

  // Forward passes only (evaluation): each micro-batch received, forwarded and sent on through
  // every chunk in turn; the last stage writes the losses.
  void forward_only(Weights<Act>& weights, const std::vector<MicroBatch>& batches);

  // Seconds this stage's host spent blocked in transfer groups during the last run(), and the
  // run's length: on the CPU the measured pipeline bubble is their ratio (a GPU's transfers are
  // queued on its stream, so its host is not blocked there).
  double wait_seconds() const { return wait_seconds_; }
  double run_seconds() const { return run_seconds_; }
  // The bytes of its backward send buffers (in the arena).
  size_t send_buffer_bytes() const { return send_bytes_; }

 private:
  std::vector<Gpt<Backend>*> models_;
  Comm* pp_;
  std::vector<Action> schedule_;
  int B_, T_;
  size_t activation_elems_;
  Arena* arena_;
  // SendBackward's copy of a chunk's grad_input(): a RecvBackward in the same group writes that
  // scratch, and the next backward pass overwrites it while an MPI send may still read the copy.
  // A pool per chunk, used in turn (send_pool_size), not one per micro-batch in flight: chunk
  // c's buffers start at send_slot_[c], send_pool_[c] of them.
  bool has_send_ = false;
  size_t h_send_ = 0, send_bytes_ = 0;
  Act* backward_send_ = nullptr;
  std::vector<size_t> send_slot_;
  std::vector<int> send_pool_;
  double wait_seconds_ = 0, run_seconds_ = 0;

  void walk(const std::vector<Action>& actions, Weights<Act>& weights,
            const std::vector<MicroBatch>& batches, float dloss,
            const std::function<void(int layer)>& layer_done);
};

// Slots chunk `chunk` of a stage needs for its schedule (at least 1).
int schedule_slots(const std::vector<Action>& schedule, int chunk = 0);
// Backward send buffers chunk `chunk` keeps: two, used in turn (a send's buffer is reused two
// sends later, once that send has left: on NCCL at its group's end, on MPI a wait), or as many
// as one transfer group of the schedule sends, but never more than its slots. Bounded by what
// the schedule has in flight, not by the micro-batch count.
int send_pool_size(const std::vector<Action>& schedule, int chunk = 0);

}  // namespace tessera
