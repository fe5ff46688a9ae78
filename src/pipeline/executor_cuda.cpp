#include "pipeline/executor_cuda.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <stdexcept>

#include "backend/cuda/context.hpp"
#include "backend/cuda/ops.hpp"
#include "device/check.hpp"

namespace tessera {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

template <typename F>
PipelineExecutorCuda<F>::PipelineExecutorCuda(GptCuda<F>& model, device::NcclComm* pp,
                                              std::vector<Action> schedule, int B, int T,
                                              device::DeviceArena& arena)
    : model_(model), pp_(pp), schedule_(std::move(schedule)), slots_(schedule_slots(schedule_)),
      B_(B), T_(T), arena_(&arena) {
  activation_elems_ = size_t(B) * T * size_t(model.layout().canonical.shape.n_embd);
  if (!model.layout().first)
    h_send_ = arena.add("pipeline backward send buffer", activation_elems_ * sizeof(F));
}

template <typename F>
void PipelineExecutorCuda<F>::bind() {
  if (!model_.layout().first) backward_send_ = arena_->get<F>(h_send_);
}

template <typename F>
double PipelineExecutorCuda<F>::run(const F* params, float* grads,
                                    const std::vector<MicroBatch>& batches, float dloss,
                                    const std::function<void(int layer)>& layer_done) {
  return walk(schedule_, params, grads, batches, dloss, layer_done);
}

template <typename F>
double PipelineExecutorCuda<F>::forward_only(const F* params,
                                             const std::vector<MicroBatch>& batches) {
  const bool first = pp_->rank() == 0, last = pp_->rank() == pp_->size() - 1;
  std::vector<Action> actions;
  for (int mb = 0; mb < int(batches.size()); ++mb) {
    if (!first) actions.push_back({Op::RecvForward, mb});
    actions.push_back({Op::Forward, mb});
    if (!last) actions.push_back({Op::SendForward, mb});
  }
  return walk(actions, params, nullptr, batches, 0.0f, {});
}

template <typename F>
double PipelineExecutorCuda<F>::walk(const std::vector<Action>& actions, const F* params,
                                     float* grads, const std::vector<MicroBatch>& batches,
                                     float dloss,
                                     const std::function<void(int layer)>& layer_done) {
  const double t_start = now();
  const int prev = pp_->rank() - 1, next = pp_->rank() + 1;
  const size_t n = activation_elems_;
  const cudaStream_t st = cuda::stream();
  double loss = 0;
  // The last backward of the step completes the gradients: only it reports finished layers.
  const Action* last_backward = nullptr;
  for (const Action& a : actions)
    if (a.op == Op::Backward) last_backward = &a;
  // Each group: one compute action, or a run of consecutive transfers issued together.
  size_t at = 0;
  for (const std::vector<Action>& group : transfer_groups(actions)) {
    const Action& a = actions[at];  // the group's first action, in `actions` (for last_backward)
    at += group.size();
    const int slot = a.mb % slots_;
    const MicroBatch& mb = batches[size_t(a.mb)];
    if (a.op == Op::Forward) {
      // Stream order: the slot's previous SendForward has left before this overwrites it.
      loss += model_.forward(params, slot, mb.tokens, mb.targets, B_, T_);
      continue;
    }
    if (a.op == Op::Backward) {
      model_.backward(params, grads, slot, mb.tokens, B_, T_, dloss,
                      &a == last_backward ? layer_done : std::function<void(int)>{});
      continue;
    }
    for (const Action& t : group)
      if (t.op == Op::SendBackward)
        CUDA_CHECK(cudaMemcpyAsync(backward_send_, model_.grad_input(), n * sizeof(F),
                                   cudaMemcpyDeviceToDevice, st));
    NCCL_CHECK(ncclGroupStart());
    for (const Action& t : group) {
      const int s = t.mb % slots_;
      switch (t.op) {
        case Op::RecvForward: pp_->recv(model_.input(s), n, prev, st); break;
        case Op::SendForward: pp_->send(model_.output(s), n, next, st); break;
        case Op::RecvBackward: pp_->recv(model_.grad_output(), n, next, st); break;
        case Op::SendBackward: pp_->send(static_cast<const F*>(backward_send_), n, prev, st); break;
        default: throw std::logic_error("transfer group holds a compute action");
      }
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  run_seconds_ = now() - t_start;
  return loss;
}

template class PipelineExecutorCuda<float>;
template class PipelineExecutorCuda<cuda::bf16>;

}  // namespace tessera
