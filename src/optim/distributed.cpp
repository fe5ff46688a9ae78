#include "optim/distributed.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
DistributedOptimizer<Backend>::DistributedOptimizer(const LocalLayout& layout, const Comms& comms,
                                                    int stage, const ShardPlan* plan,
                                                    const AdamWHyper& hyper, Arena& arena)
    : layout_(layout), comms_(comms), stage_(stage == 1 && !comms.shard->active() ? 0 : stage),
      plan_(plan), hyper_(hyper), arena_(&arena) {
  const size_t n = size_t(comms.shard->size());
  padded_ = stage_ == 1 ? (layout.total + n - 1) / n * n : layout.total;
  const size_t slice = stage_ == 1 ? padded_ / n : padded_;
  shard_begin_ = stage_ == 1 ? size_t(comms.shard->rank()) * slice : 0;
  shard_end_ = stage_ >= 2 ? plan->total : shard_begin_ + slice;
  const size_t state = shard_end_ - shard_begin_;
  h_norm_ = arena.add("gradient norm accumulator", sizeof(double));
  h_m_ = arena.add("Adam first moments", state * sizeof(float));
  h_v_ = arena.add("Adam second moments", state * sizeof(float));
}

template <class Backend>
void DistributedOptimizer<Backend>::bind() {
  const size_t state = shard_end_ - shard_begin_;
  norm_ = arena_->get<double>(h_norm_);
  m_ = arena_->get<float>(h_m_);
  v_ = arena_->get<float>(h_v_);
  Backend::zero(m_, state * sizeof(float));
  Backend::zero(v_, state * sizeof(float));
}

template <class Backend>
template <typename Fn>
void DistributedOptimizer<Backend>::for_each_piece(Fn f) const {
  auto pieces = [&](size_t lo, size_t hi, size_t state_at_lo) {
    for (const LocalTensor& t : layout_.tensors) {
      const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
      if (a < b) f(t, a, state_at_lo + (a - lo), b - a);
    }
  };
  if (stage_ < 2) {
    pieces(shard_begin_, std::min(shard_end_, layout_.total), 0);
    return;
  }
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const auto [lo, hi] = plan_->range(layout_, int(u));
    if (lo < hi) pieces(lo, hi, plan_->offset[u]);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::start_reduce(float* grads, size_t begin, size_t end) {
  if (!comms_.dp->active() || stage_ != 0 || begin >= end) return;
  comms_.dp->start_all_reduce_sum(grads + begin, end - begin);
  started_.emplace_back(begin, end);
}

template <class Backend>
void DistributedOptimizer<Backend>::reduce_gradients(float* grads) {
  if (stage_ == 1) {
    // In place: the slice's sums land in the gradient buffer (where, the communicator says).
    grad_shard_ = comms_.shard->reduce_scatter_sum_in_place(grads, shard_end_ - shard_begin_);
    comms_.replica->all_reduce_sum(grad_shard_, shard_end_ - shard_begin_);
    return;
  }
  if (stage_ >= 2) {
    comms_.replica->all_reduce_sum(grads, plan_->total);
    return;
  }
  if (!comms_.dp->active()) return;
  // Whatever the backward pass did not start: the gaps between the started ranges.
  std::vector<std::pair<size_t, size_t>> started = started_;
  std::sort(started.begin(), started.end());
  size_t at = 0;
  for (const auto& [begin, end] : started) {
    start_reduce(grads, at, begin);
    at = std::max(at, end);
  }
  start_reduce(grads, at, padded_);
  comms_.dp->wait_reductions();
  started_.clear();
}

template <class Backend>
double DistributedOptimizer<Backend>::grad_norm(const float* grads) const {
  // Without ZeRO every dp rank holds the same sums: dp rank 0 speaks for its group. Under ZeRO
  // each rank of a shard group counts its slice or parts (the first replica's group speaks for
  // the others). Within those, only owners count (one tp rank for replicated tensors, stage 0
  // for the tied embedding). The pieces add into one device double; the host reads it once.
  Backend::zero(norm_, sizeof(double));
  const bool speaks = stage_ == 0 ? comms_.dp->rank() == 0 : comms_.replica->rank() == 0;
  if (speaks) {
    const float* g = stage_ == 1 ? grad_shard_ : grads;
    for_each_piece([&](const LocalTensor& t, size_t local, size_t state, size_t n) {
      if (t.owner) Backend::sum_of_squares(norm_, g + (stage_ == 0 ? local : state), n);
    });
  }
  double local = 0.0;
  Backend::to_host(&local, norm_, sizeof(double));
  double total = local;
  Comm* world = comms_.world;
  if (world->active()) MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, world->mpi());
  return std::sqrt(total);
}

template <class Backend>
void DistributedOptimizer<Backend>::step(float* master, Act* copy, float* grads, double clip,
                                         double lr, long t) {
  float* g = stage_ == 1 ? grad_shard_ : grads;
  if (clip < 1.0) Backend::scale(g, shard_end_ - shard_begin_, float(clip));
  // Where each piece's master and copy are: at its local index in a full buffer, or at its
  // state index among the parts.
  constexpr bool kFp32 = std::is_same_v<Act, float>;
  const bool master_full = stage_ <= 1 || (stage_ == 2 && kFp32);
  const bool copy_full = stage_ <= 2;
  for_each_piece([&](const LocalTensor& tensor, size_t local, size_t state, size_t n) {
    const size_t gi = stage_ == 0 ? local : state;
    Backend::adamw_update(master + (master_full ? local : state),
                          copy ? copy + (copy_full ? local : state) : nullptr,
                          static_cast<const float*>(g + gi), m_ + gi, v_ + gi, n,
                          layout_.canon(tensor).weight_decay, hyper_, lr, t);
  });
  if (stage_ == 1) {
    // In place: this rank's slice is already at its place in the full buffer.
    const size_t slice = shard_end_ - shard_begin_;
    comms_.shard->all_gather(static_cast<const float*>(master + shard_begin_), master, slice);
    if (copy) comms_.shard->all_gather(static_cast<const Act*>(copy + shard_begin_), copy, slice);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::get_moments(std::vector<float>& m, std::vector<float>& v) {
  m.assign(state_size(), 0.0f);
  v.assign(state_size(), 0.0f);
  const size_t state = shard_end_ - shard_begin_;
  Backend::to_host(m.data() + shard_begin_, m_, state * sizeof(float));
  Backend::to_host(v.data() + shard_begin_, v_, state * sizeof(float));
  if (stage_ != 1) return;
  // Each rank of the shard group holds its slice: gathered on the host over the group's MPI
  // communicator (checkpoints are written from host memory).
  MPI_Comm group = comms_.shard->mpi();
  MPI_Allgather(MPI_IN_PLACE, int(state), MPI_FLOAT, m.data(), int(state), MPI_FLOAT, group);
  MPI_Allgather(MPI_IN_PLACE, int(state), MPI_FLOAT, v.data(), int(state), MPI_FLOAT, group);
}

template <class Backend>
void DistributedOptimizer<Backend>::set_moments(const std::vector<float>& m,
                                                const std::vector<float>& v) {
  const size_t state = shard_end_ - shard_begin_;
  Backend::to_device(m_, m.data() + shard_begin_, state * sizeof(float));
  Backend::to_device(v_, v.data() + shard_begin_, state * sizeof(float));
}

template class DistributedOptimizer<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp).
template DistributedOptimizer<DeclareBackend<float>>::DistributedOptimizer(
    const LocalLayout&, const Comms&, int, const ShardPlan*, const AdamWHyper&, Arena&);
template DistributedOptimizer<DeclareBackend<Bf16Bytes>>::DistributedOptimizer(
    const LocalLayout&, const Comms&, int, const ShardPlan*, const AdamWHyper&, Arena&);
#ifdef TESSERA_CUDA
template class DistributedOptimizer<CudaBackend<float>>;
template class DistributedOptimizer<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
