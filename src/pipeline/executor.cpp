#include "pipeline/executor.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "parallel/comm.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int schedule_slots(const std::vector<Action>& schedule, int chunk) {
  return std::max(1, max_in_flight(schedule, chunk));
}

int send_pool_size(const std::vector<Action>& schedule, int chunk) {
  int most = 0;  // SendBackwards of the chunk in one transfer group
  for (const std::vector<Action>& group : transfer_groups(schedule)) {
    int n = 0;
    for (const Action& a : group) n += a.op == Op::SendBackward && a.chunk == chunk;
    most = std::max(most, n);
  }
  return std::min(schedule_slots(schedule, chunk), std::max(2, most));
}

template <class Backend>
PipelineExecutor<Backend>::PipelineExecutor(std::vector<Gpt<Backend>*> models, Comm* pp,
                                            std::vector<Action> schedule, int B, int T,
                                            Arena& arena)
    : models_(std::move(models)), pp_(pp), schedule_(std::move(schedule)), B_(B), T_(T),
      arena_(&arena) {
  // What crosses stages: B*T rows of C, or under sequence parallelism this rank's share.
  activation_elems_ = models_.front()->boundary_elems();
  size_t slots = 0;
  for (int c = 0; c < int(models_.size()); ++c) {
    send_slot_.push_back(slots);
    // the model's first chunk sends no gradient
    send_pool_.push_back(models_[size_t(c)]->first() ? 0 : send_pool_size(schedule_, c));
    slots += size_t(send_pool_.back());
  }
  has_send_ = slots > 0;
  send_bytes_ = slots * activation_elems_ * sizeof(Act);
  if (has_send_) h_send_ = arena.add("pipeline backward send buffers", send_bytes_);
}

template <class Backend>
void PipelineExecutor<Backend>::bind() {
  if (has_send_) backward_send_ = arena_->get<Act>(h_send_);
}

template <class Backend>
void PipelineExecutor<Backend>::run(Weights<Act>& weights, const std::vector<MicroBatch>& batches,
                                    float dloss,
                                    const std::function<void(int layer)>& layer_done) {
  walk(schedule_, weights, batches, dloss, layer_done);
}

template <class Backend>
void PipelineExecutor<Backend>::forward_only(Weights<Act>& weights,
                                             const std::vector<MicroBatch>& batches) {
  // Each micro-batch through every chunk before the next: a chain of lone transfers, in the
  // order every stage meets them.
  std::vector<Action> actions;
  for (int mb = 0; mb < int(batches.size()); ++mb) {
    for (int c = 0; c < int(models_.size()); ++c) {
      if (!models_[size_t(c)]->first()) actions.push_back({Op::RecvForward, mb, c});
      actions.push_back({Op::Forward, mb, c});
      if (!models_[size_t(c)]->last()) actions.push_back({Op::SendForward, mb, c});
    }
  }
  walk(actions, weights, batches, 0.0f, {});
}

namespace {
// MPI tags: every (kind, micro-batch, sending chunk) its own, so activations and gradients that
// share a pair of ranks (pp = 2 with virtual stages) are never matched with each other. NCCL has
// no tags: there the order the schedule guarantees does it (simulate_grouped).
int message_tag(bool gradient, int mb, int sender_chunk, int chunks) {
  return (mb * chunks + sender_chunk) * 2 + (gradient ? 1 : 0);
}
}  // namespace

template <class Backend>
void PipelineExecutor<Backend>::walk(const std::vector<Action>& actions, Weights<Act>& weights,
                                     const std::vector<MicroBatch>& batches, float dloss,
                                     const std::function<void(int layer)>& layer_done) {
  const double t_start = now();
  wait_seconds_ = 0;
  const int stage = pp_->rank(), pp = pp_->size(), chunks = int(models_.size());
  const size_t n = activation_elems_;
  // Each chunk's last backward of the step completes its gradients: only it reports layers.
  std::vector<const Action*> last_backward(size_t(chunks), nullptr);
  for (const Action& a : actions)
    if (a.op == Op::Backward) last_backward[size_t(a.chunk)] = &a;
  auto slot_of = [&](const Action& a) { return a.mb % models_[size_t(a.chunk)]->slots(); };
  // Each chunk's sends take its pool's buffers in turn; a group's SendBackward is given its
  // buffer when copied, and sent from the same one.
  std::vector<int> sends(size_t(chunks), 0);
  std::vector<Act*> group_buffer;
  // Each group: one compute action, or a run of consecutive transfers issued together.
  size_t at = 0;
  for (const std::vector<Action>& group : transfer_groups(actions)) {
    const Action& a = actions[at];  // the group's first action, in `actions` (for last_backward)
    at += group.size();
    Gpt<Backend>& model = *models_[size_t(a.chunk)];
    const int slot = slot_of(a);
    const MicroBatch& mb = batches[size_t(a.mb)];
    trace::set_micro(a.mb);
    if (a.op == Op::Forward) {
      pp_->wait_send(model.output(slot));  // the slot's output is overwritten: its send has left
      model.forward(weights, slot, mb.tokens, mb.targets, mb.losses, B_, T_, mb.docs);
      continue;
    }
    if (a.op == Op::Backward) {
      model.backward(weights, slot, mb.tokens, B_, T_, dloss,
                     &a == last_backward[size_t(a.chunk)] ? layer_done
                                                          : std::function<void(int)>{});
      continue;
    }
    group_buffer.assign(group.size(), nullptr);
    for (size_t i = 0; i < group.size(); ++i) {
      const Action& t = group[i];
      if (t.op != Op::SendBackward) continue;
      const size_t c = size_t(t.chunk);
      Act* buffer = backward_send_ + (send_slot_[c] + size_t(sends[c]++ % send_pool_[c])) * n;
      pp_->wait_send(buffer);
      Backend::copy(buffer, models_[c]->grad_input(), n * sizeof(Act));
      group_buffer[i] = buffer;
    }
    const double t0 = now();
    pp_->group_start();
    for (size_t i = 0; i < group.size(); ++i) {
      const Action& t = group[i];
      Gpt<Backend>& m = *models_[size_t(t.chunk)];
      const int s = slot_of(t);
      const Peer peer = transfer_peer(t.op, stage, t.chunk, pp);
      switch (t.op) {
        case Op::RecvForward:
          pp_->recv(m.input(s), n, peer.stage, message_tag(false, t.mb, peer.chunk, chunks));
          break;
        case Op::SendForward:
          pp_->send(m.output(s), n, peer.stage, message_tag(false, t.mb, t.chunk, chunks));
          break;
        case Op::RecvBackward:
          pp_->recv(m.grad_output(), n, peer.stage, message_tag(true, t.mb, peer.chunk, chunks));
          break;
        case Op::SendBackward:
          pp_->send(static_cast<const Act*>(group_buffer[i]), n, peer.stage,
                    message_tag(true, t.mb, t.chunk, chunks));
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
// Declarations only (`tessera plan`, backend/declare.hpp).
template PipelineExecutor<DeclareBackend<float>>::PipelineExecutor(std::vector<Gpt<DeclareBackend<float>>*>, Comm*, std::vector<Action>, int, int, Arena&);
template PipelineExecutor<DeclareBackend<Bf16Bytes>>::PipelineExecutor(std::vector<Gpt<DeclareBackend<Bf16Bytes>>*>, Comm*, std::vector<Action>, int, int, Arena&);
#ifdef TESSERA_CUDA
template class PipelineExecutor<CudaBackend<float>>;
template class PipelineExecutor<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
