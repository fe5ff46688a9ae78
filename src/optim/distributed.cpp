#include "optim/distributed.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>

namespace tessera {

namespace {
constexpr size_t kBucket = size_t(1) << 22;  // elements per all-reduce bucket (16 MB)
}

DistributedOptimizer::DistributedOptimizer(const LocalLayout& layout, Comm* dp, Comm* world,
                                           bool zero, const AdamWHyper& hyper)
    : layout_(layout), dp_(dp), world_(world), zero_(zero && dp->active()), hyper_(hyper) {
  const size_t n = size_t(dp->size());
  padded_ = zero_ ? (layout.total + n - 1) / n * n : layout.total;
  const size_t shard = padded_ / (zero_ ? n : 1);
  shard_begin_ = zero_ ? size_t(dp->rank()) * shard : 0;
  shard_end_ = shard_begin_ + shard;
  m_.assign(shard, 0.0f);
  v_.assign(shard, 0.0f);
  if (zero_) grad_shard_.assign(shard, 0.0f);
}

template <typename F>
void DistributedOptimizer::for_each_piece(size_t lo, size_t hi, F f) const {
  for (const LocalTensor& t : layout_.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a < b) f(t, a, b);
  }
}

void DistributedOptimizer::start_reduce(float* grads, size_t begin, size_t end) {
  if (!dp_->active() || zero_ || begin >= end) return;
  for (size_t b = begin; b < end; b += kBucket) {
    pending_.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, grads + b, int(std::min(kBucket, end - b)), MPI_FLOAT, MPI_SUM,
                   dp_->get(), &pending_.back());
  }
  started_.emplace_back(begin, end);
  dp_->count((end - begin) * sizeof(float));
  // MPICH progresses non-blocking collectives only inside MPI calls: give it one now.
  int done = 0;
  MPI_Testall(int(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE);
}

void DistributedOptimizer::reduce_gradients(float* grads) {
  if (!dp_->active()) return;
  if (zero_) {
    const size_t shard = shard_end_ - shard_begin_;
    MPI_Reduce_scatter_block(grads, grad_shard_.data(), int(shard), MPI_FLOAT, MPI_SUM, dp_->get());
    dp_->count(padded_ * sizeof(float));
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
  MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE);
  pending_.clear();
  started_.clear();
}

double DistributedOptimizer::grad_norm(const float* grads) const {
  // Without ZeRO every dp rank holds the same sums: dp rank 0 speaks for its group. Under ZeRO
  // each rank counts its shard. Within those, only owners count (one tp rank for replicated
  // tensors, stage 0 for the tied embedding).
  double local = 0.0;
  if (zero_ || dp_->rank() == 0) {
    const float* g = reduced(grads);
    for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& t, size_t a, size_t b) {
      if (t.owner) local += sum_of_squares(g + (a - shard_begin_), b - a);
    });
  }
  double total = local;
  if (world_->active()) MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, world_->get());
  return std::sqrt(total);
}

void DistributedOptimizer::step(float* params, float* grads, double clip, double lr, long t) {
  float* g = zero_ ? grad_shard_.data() : grads;
  const size_t shard = shard_end_ - shard_begin_;
  if (clip < 1.0) scale(g, shard, float(clip));
  for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& tensor, size_t a, size_t b) {
    const size_t i = a - shard_begin_;
    adamw_update(params + a, g + i, m_.data() + i, v_.data() + i, b - a,
                 layout_.canon(tensor).weight_decay, hyper_, lr, t);
  });
  if (zero_) {
    MPI_Allgather(MPI_IN_PLACE, int(shard), MPI_FLOAT, params, int(shard), MPI_FLOAT, dp_->get());
    dp_->count(padded_ * sizeof(float));
  }
}

void DistributedOptimizer::get_moments(std::vector<float>& m, std::vector<float>& v) {
  m.assign(padded_, 0.0f);
  v.assign(padded_, 0.0f);
  std::copy(m_.begin(), m_.end(), m.begin() + long(shard_begin_));
  std::copy(v_.begin(), v_.end(), v.begin() + long(shard_begin_));
  if (!zero_) return;
  const int shard = int(m_.size());
  MPI_Allgather(MPI_IN_PLACE, shard, MPI_FLOAT, m.data(), shard, MPI_FLOAT, dp_->get());
  MPI_Allgather(MPI_IN_PLACE, shard, MPI_FLOAT, v.data(), shard, MPI_FLOAT, dp_->get());
}

void DistributedOptimizer::set_moments(const std::vector<float>& m, const std::vector<float>& v) {
  std::copy(m.begin() + long(shard_begin_), m.begin() + long(shard_end_), m_.begin());
  std::copy(v.begin() + long(shard_begin_), v.begin() + long(shard_end_), v_.begin());
}

}  // namespace tessera
