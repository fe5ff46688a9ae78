#include "optim/distributed.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
DistributedOptimizer<Backend>::DistributedOptimizer(const LocalLayout& layout,
                                                    typename Backend::Comm* dp, Comm* world,
                                                    bool zero, const AdamWHyper& hyper,
                                                    Arena& arena)
    : layout_(layout), dp_(dp), world_(world), zero_(zero && dp->active()), hyper_(hyper),
      arena_(&arena) {
  const size_t n = size_t(dp->size());
  padded_ = zero_ ? (layout.total + n - 1) / n * n : layout.total;
  const size_t shard = padded_ / (zero_ ? n : 1);
  shard_begin_ = zero_ ? size_t(dp->rank()) * shard : 0;
  shard_end_ = shard_begin_ + shard;
  h_norm_ = arena.add("gradient norm accumulator", sizeof(double));
  h_m_ = arena.add("Adam first moments", shard * sizeof(float));
  h_v_ = arena.add("Adam second moments", shard * sizeof(float));
  if (zero_) h_shard_ = arena.add("ZeRO-1 gradient shard", shard * sizeof(float));
}

template <class Backend>
void DistributedOptimizer<Backend>::bind() {
  const size_t shard = shard_end_ - shard_begin_;
  norm_ = arena_->get<double>(h_norm_);
  m_ = arena_->get<float>(h_m_);
  v_ = arena_->get<float>(h_v_);
  if (zero_) grad_shard_ = arena_->get<float>(h_shard_);
  Backend::zero(m_, shard * sizeof(float));
  Backend::zero(v_, shard * sizeof(float));
}

template <class Backend>
template <typename Fn>
void DistributedOptimizer<Backend>::for_each_piece(size_t lo, size_t hi, Fn f) const {
  for (const LocalTensor& t : layout_.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a < b) f(t, a, b);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::start_reduce(float* grads, size_t begin, size_t end) {
  if (!dp_->active() || zero_ || begin >= end) return;
  dp_->start_all_reduce_sum(grads + begin, end - begin);
  started_.emplace_back(begin, end);
}

template <class Backend>
void DistributedOptimizer<Backend>::reduce_gradients(float* grads) {
  if (!dp_->active()) return;
  if (zero_) {
    dp_->reduce_scatter_sum(static_cast<const float*>(grads), grad_shard_,
                            shard_end_ - shard_begin_);
    return;
  }
  // Whatever the backward pass did not start: the gaps between the started ranges.
  std::vector<std::pair<size_t, size_t>> started = started_;
  std::sort(started.begin(), started.end());
  size_t at = 0;
  for (const auto& [begin, end] : started) {
    start_reduce(grads, at, begin);
    at = std::max(at, end);
  }
  start_reduce(grads, at, padded_);
  dp_->wait_reductions();
  started_.clear();
}

template <class Backend>
double DistributedOptimizer<Backend>::grad_norm(const float* grads) const {
  // Without ZeRO every dp rank holds the same sums: dp rank 0 speaks for its group. Under ZeRO
  // each rank counts its shard. Within those, only owners count (one tp rank for replicated
  // tensors, stage 0 for the tied embedding).
  // The pieces add into one device double; the host reads it once.
  Backend::zero(norm_, sizeof(double));
  if (zero_ || dp_->rank() == 0) {
    const float* g = reduced(grads);
    for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& t, size_t a, size_t b) {
      if (t.owner) Backend::sum_of_squares(norm_, g + (a - shard_begin_), b - a);
    });
  }
  double local = 0.0;
  Backend::to_host(&local, norm_, sizeof(double));
  double total = local;
  if (world_->active()) MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, world_->mpi());
  return std::sqrt(total);
}

template <class Backend>
void DistributedOptimizer<Backend>::step(float* master, Act* copy, float* grads, double clip,
                                         double lr, long t) {
  float* g = zero_ ? grad_shard_ : grads;
  const size_t shard = shard_end_ - shard_begin_;
  if (clip < 1.0) Backend::scale(g, shard, float(clip));
  for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& tensor, size_t a, size_t b) {
    const size_t i = a - shard_begin_;
    Backend::adamw_update(master + a, copy ? copy + a : nullptr, static_cast<const float*>(g + i),
                    m_ + i, v_ + i, b - a, layout_.canon(tensor).weight_decay, hyper_, lr, t);
  });
  if (zero_) {
    // In place: this rank's shard is already at its place in the full buffer.
    dp_->all_gather(static_cast<const float*>(master + shard_begin_), master, shard);
    if (copy) dp_->all_gather(static_cast<const Act*>(copy + shard_begin_), copy, shard);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::get_moments(std::vector<float>& m, std::vector<float>& v) {
  m.assign(padded_, 0.0f);
  v.assign(padded_, 0.0f);
  const size_t shard = shard_end_ - shard_begin_;
  Backend::to_host(m.data() + shard_begin_, m_, shard * sizeof(float));
  Backend::to_host(v.data() + shard_begin_, v_, shard * sizeof(float));
  if (!zero_) return;
  // Each dp rank holds its shard: gathered on the host over the dp group's MPI communicator
  // (checkpoints are written from host memory).
  MPI_Allgather(MPI_IN_PLACE, int(shard), MPI_FLOAT, m.data(), int(shard), MPI_FLOAT, dp_->mpi());
  MPI_Allgather(MPI_IN_PLACE, int(shard), MPI_FLOAT, v.data(), int(shard), MPI_FLOAT, dp_->mpi());
}

template <class Backend>
void DistributedOptimizer<Backend>::set_moments(const std::vector<float>& m,
                                          const std::vector<float>& v) {
  const size_t shard = shard_end_ - shard_begin_;
  Backend::to_device(m_, m.data() + shard_begin_, shard * sizeof(float));
  Backend::to_device(v_, v.data() + shard_begin_, shard * sizeof(float));
}

template class DistributedOptimizer<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp).
template DistributedOptimizer<DeclareBackend<float>>::DistributedOptimizer(const LocalLayout&, Comm*, Comm*, bool, const AdamWHyper&, Arena&);
template DistributedOptimizer<DeclareBackend<Bf16Bytes>>::DistributedOptimizer(const LocalLayout&, Comm*, Comm*, bool, const AdamWHyper&, Arena&);
#ifdef TESSERA_CUDA
template class DistributedOptimizer<CudaBackend<float>>;
template class DistributedOptimizer<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
