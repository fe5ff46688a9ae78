#pragma once
// The GPU twin of pipeline/executor.hpp (CUDA builds only): walks the same schedule for one
// optimizer step with GptCuda, the activations and their gradients moving over the pp NCCL
// communicator on the backend's stream.
//
// The one difference from the CPU walk: an NCCL send blocks the stream until the peer posts the
// matching receive (there is no MPI_Isend), so a lone send where the neighbour is sending back
// (1F1B's steady state) would deadlock. Every run of consecutive transfers of the schedule is
// therefore one ncclGroupStart/End (transfer_groups in pipeline/schedule.hpp; simulate_grouped
// and the unit tests check every generated schedule completes that way). NCCL matches messages
// between two ranks in order, without tags: each stage sends and receives each kind in the same
// micro-batch order as its neighbour, which `simulate` checks too.
#include <functional>
#include <vector>

#include "device/arena.hpp"
#include "device/nccl_comm.hpp"
#include "model/gpt_cuda.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

template <typename F>
class PipelineExecutorCuda {
 public:
  // Declares its send buffer in `arena`; bind() after the arena is allocated.
  PipelineExecutorCuda(GptCuda<F>& model, device::NcclComm* pp, std::vector<Action> schedule,
                       int B, int T, device::DeviceArena& arena);
  void bind();

  int slots() const { return slots_; }
  // As PipelineExecutor::run; batches hold device pointers.
  double run(const F* params, float* grads, const std::vector<MicroBatch>& batches, float dloss,
             const std::function<void(int layer)>& layer_done = {});
  // As PipelineExecutor::forward_only.
  double forward_only(const F* params, const std::vector<MicroBatch>& batches);

  // Receives are queued on the stream, so the host never blocks in one: no bubble is measured
  // here (0); run_seconds is the host's walk, up to the last loss.
  double wait_seconds() const { return 0.0; }
  double run_seconds() const { return run_seconds_; }

 private:
  GptCuda<F>& model_;
  device::NcclComm* pp_;
  std::vector<Action> schedule_;
  int slots_, B_, T_;
  size_t activation_elems_;
  device::DeviceArena* arena_;
  size_t h_send_ = 0;
  // SendBackward's copy of grad_input(): a RecvBackward in the same group writes that scratch.
  // One buffer serves every slot, as the stream orders each group after the previous one.
  F* backward_send_ = nullptr;
  double run_seconds_ = 0;

  double walk(const std::vector<Action>& actions, const F* params, float* grads,
              const std::vector<MicroBatch>& batches, float dloss,
              const std::function<void(int layer)>& layer_done);
};

}  // namespace tessera
