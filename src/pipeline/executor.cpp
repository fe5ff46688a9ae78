#include "pipeline/executor.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cpu/backend.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int schedule_slots(const std::vector<Action>& schedule) {
  return std::max(1, max_in_flight(schedule));
}

template <class Backend>
PipelineExecutor<Backend>::PipelineExecutor(Gpt<Backend>& model, Comm* pp,
                                            std::vector<Action> schedule, int B, int T,
                                            Arena& arena)
    : model_(model), pp_(pp), schedule_(std::move(schedule)), slots_(schedule_slots(schedule_)),
      B_(B), T_(T), arena_(&arena) {
  // What crosses stages: B*T rows of C, or under sequence parallelism this rank's share.
  activation_elems_ = model.boundary_elems();
  if (!model.layout().first)
    h_send_ = arena.add("pipeline backward send buffers",
                        size_t(slots_) * activation_elems_ * sizeof(Act));
}

template <class Backend>
void PipelineExecutor<Backend>::bind() {
  if (!model_.layout().first) backward_send_ = arena_->get<Act>(h_send_);
}

template <class Backend>
void PipelineExecutor<Backend>::run(const Act* params, float* grads,
                                    const std::vector<MicroBatch>& batches, float dloss,
                                    const std::function<void(int layer)>& layer_done) {
  walk(schedule_, params, grads, batches, dloss, layer_done);
}

template <class Backend>
void PipelineExecutor<Backend>::forward_only(const Act* params,
                                             const std::vector<MicroBatch>& batches) {
  const bool first = pp_->rank() == 0, last = pp_->rank() == pp_->size() - 1;
  std::vector<Action> actions;
  for (int mb = 0; mb < int(batches.size()); ++mb) {
    if (!first) actions.push_back({Op::RecvForward, mb});
    actions.push_back({Op::Forward, mb});
    if (!last) actions.push_back({Op::SendForward, mb});
  }
  walk(actions, params, nullptr, batches, 0.0f, {});
}

template <class Backend>
void PipelineExecutor<Backend>::walk(const std::vector<Action>& actions, const Act* params,
                                     float* grads, const std::vector<MicroBatch>& batches,
                                     float dloss,
                                     const std::function<void(int layer)>& layer_done) {
  const double t_start = now();
  wait_seconds_ = 0;
  const int prev = pp_->rank() - 1, next = pp_->rank() + 1;
  const size_t n = activation_elems_;
  // The last backward of the step completes the gradients: only it reports finished layers.
  const Action* last_backward = nullptr;
  for (const Action& a : actions)
    if (a.op == Op::Backward) last_backward = &a;
  auto send_buffer = [&](int slot) { return backward_send_ + size_t(slot) * n; };
  // Each group: one compute action, or a run of consecutive transfers issued together.
  size_t at = 0;
  for (const std::vector<Action>& group : transfer_groups(actions)) {
    const Action& a = actions[at];  // the group's first action, in `actions` (for last_backward)
    at += group.size();
    const int slot = a.mb % slots_;
    const MicroBatch& mb = batches[size_t(a.mb)];
    if (a.op == Op::Forward) {
      pp_->wait_send(model_.output(slot));  // the slot's output is overwritten: its send has left
      model_.forward(params, slot, mb.tokens, mb.targets, mb.losses, B_, T_);
      continue;
    }
    if (a.op == Op::Backward) {
      model_.backward(params, grads, slot, mb.tokens, B_, T_, dloss,
                      &a == last_backward ? layer_done : std::function<void(int)>{});
      continue;
    }
    for (const Action& t : group) {
      if (t.op != Op::SendBackward) continue;
      Act* buffer = send_buffer(t.mb % slots_);
      pp_->wait_send(buffer);
      Backend::copy(buffer, model_.grad_input(), n * sizeof(Act));
    }
    const double t0 = now();
    pp_->group_start();
    for (const Action& t : group) {
      const int s = t.mb % slots_;
      switch (t.op) {
        case Op::RecvForward: pp_->recv(model_.input(s), n, prev, t.mb); break;
        case Op::SendForward: pp_->send(model_.output(s), n, next, t.mb); break;
        case Op::RecvBackward: pp_->recv(model_.grad_output(), n, next, t.mb); break;
        case Op::SendBackward:
          pp_->send(static_cast<const Act*>(send_buffer(s)), n, prev, t.mb);
          break;
        default: throw std::logic_error("transfer group holds a compute action");
      }
    }
    pp_->group_end();
    wait_seconds_ += now() - t0;
  }
  pp_->wait_sends();
  run_seconds_ = now() - t_start;
}

template class PipelineExecutor<CpuBackend>;
#ifdef TESSERA_CUDA
template class PipelineExecutor<CudaBackend<float>>;
template class PipelineExecutor<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
