#include "pipeline/executor.hpp"

#include <algorithm>
#include <chrono>

namespace tessera {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void wait(MPI_Request& r) {
  if (r != MPI_REQUEST_NULL) MPI_Wait(&r, MPI_STATUS_IGNORE);
}
}  // namespace

int schedule_slots(const std::vector<Action>& schedule) {
  return std::max(1, max_in_flight(schedule));
}

PipelineExecutor::PipelineExecutor(Gpt& model, Comm* pp, std::vector<Action> schedule, int B,
                                   int T)
    : model_(model), pp_(pp), schedule_(std::move(schedule)), slots_(schedule_slots(schedule_)),
      B_(B), T_(T) {
  activation_elems_ = size_t(B) * T * size_t(model.layout().canonical.shape.n_embd);
  forward_sends_.assign(size_t(slots_), MPI_REQUEST_NULL);
  backward_sends_.assign(size_t(slots_), MPI_REQUEST_NULL);
  if (!model.layout().first)
    backward_buffers_.assign(size_t(slots_), std::vector<float>(activation_elems_));
}

double PipelineExecutor::run(const float* params, float* grads,
                             const std::vector<MicroBatch>& batches, float dloss,
                             const std::function<void(int layer)>& layer_done) {
  return walk(schedule_, params, grads, batches, dloss, layer_done);
}

double PipelineExecutor::forward_only(const float* params, const std::vector<MicroBatch>& batches) {
  const bool first = pp_->rank() == 0, last = pp_->rank() == pp_->size() - 1;
  std::vector<Action> actions;
  for (int mb = 0; mb < int(batches.size()); ++mb) {
    if (!first) actions.push_back({Op::RecvForward, mb});
    actions.push_back({Op::Forward, mb});
    if (!last) actions.push_back({Op::SendForward, mb});
  }
  return walk(actions, params, nullptr, batches, 0.0f, {});
}

double PipelineExecutor::walk(const std::vector<Action>& actions, const float* params,
                              float* grads, const std::vector<MicroBatch>& batches, float dloss,
                              const std::function<void(int layer)>& layer_done) {
  const double t_start = now();
  wait_seconds_ = 0;
  const int prev = pp_->rank() - 1, next = pp_->rank() + 1;
  const int n = int(activation_elems_);
  double loss = 0;
  // The last backward of the step completes the gradients: only it reports finished layers.
  const Action* last_backward = nullptr;
  for (const Action& a : actions)
    if (a.op == Op::Backward) last_backward = &a;
  for (const Action& a : actions) {
    const int slot = a.mb % slots_;
    const MicroBatch& mb = batches[size_t(a.mb)];
    switch (a.op) {
      case Op::RecvForward: {
        const double t0 = now();
        MPI_Recv(model_.input(slot), n, MPI_FLOAT, prev, a.mb, pp_->get(), MPI_STATUS_IGNORE);
        wait_seconds_ += now() - t0;
        break;
      }
      case Op::Forward:
        // The slot's output is overwritten: its previous send must have left.
        wait(forward_sends_[size_t(slot)]);
        loss += model_.forward(params, slot, mb.tokens, mb.targets, B_, T_);
        break;
      case Op::SendForward:
        MPI_Isend(model_.output(slot), n, MPI_FLOAT, next, a.mb, pp_->get(),
                  &forward_sends_[size_t(slot)]);
        pp_->count(activation_elems_ * sizeof(float));
        break;
      case Op::RecvBackward: {
        const double t0 = now();
        MPI_Recv(model_.grad_output(), n, MPI_FLOAT, next, a.mb, pp_->get(), MPI_STATUS_IGNORE);
        wait_seconds_ += now() - t0;
        break;
      }
      case Op::Backward:
        model_.backward(params, grads, slot, mb.tokens, B_, T_, dloss,
                        &a == last_backward ? layer_done : std::function<void(int)>{});
        break;
      case Op::SendBackward: {
        // grad_input() is scratch the next backward reuses: send from a copy per slot.
        std::vector<float>& buffer = backward_buffers_[size_t(slot)];
        wait(backward_sends_[size_t(slot)]);
        std::copy(model_.grad_input(), model_.grad_input() + activation_elems_, buffer.begin());
        MPI_Isend(buffer.data(), n, MPI_FLOAT, prev, a.mb, pp_->get(),
                  &backward_sends_[size_t(slot)]);
        pp_->count(activation_elems_ * sizeof(float));
        break;
      }
    }
  }
  for (MPI_Request& r : forward_sends_) wait(r);
  for (MPI_Request& r : backward_sends_) wait(r);
  run_seconds_ = now() - t_start;
  return loss;
}

}  // namespace tessera
