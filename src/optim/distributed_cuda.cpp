#include "optim/distributed_cuda.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/context.hpp"
#include "device/check.hpp"

namespace tessera {

DistributedOptimizerCuda::DistributedOptimizerCuda(const LocalLayout& layout,
                                                   device::NcclComm* dp, MPI_Comm world,
                                                   bool zero, const AdamWHyper& hyper,
                                                   device::DeviceArena& arena)
    : layout_(layout), dp_(dp), world_(world), zero_(zero && dp->active()), hyper_(hyper),
      arena_(&arena) {
  const size_t n = size_t(dp->size());
  padded_ = zero_ ? (layout.total + n - 1) / n * n : layout.total;
  const size_t shard = padded_ / (zero_ ? n : 1);
  shard_begin_ = zero_ ? size_t(dp->rank()) * shard : 0;
  shard_end_ = shard_begin_ + shard;
  h_m_ = arena.add("Adam first moments", shard * sizeof(float));
  h_v_ = arena.add("Adam second moments", shard * sizeof(float));
  if (zero_) h_shard_ = arena.add("ZeRO-1 gradient shard", shard * sizeof(float));
}

void DistributedOptimizerCuda::bind() {
  const size_t shard = shard_end_ - shard_begin_;
  m_ = arena_->get<float>(h_m_);
  v_ = arena_->get<float>(h_v_);
  if (zero_) grad_shard_ = arena_->get<float>(h_shard_);
  CUDA_CHECK(cudaMemsetAsync(m_, 0, shard * sizeof(float), cuda::stream()));
  CUDA_CHECK(cudaMemsetAsync(v_, 0, shard * sizeof(float), cuda::stream()));
}

template <typename Fn>
void DistributedOptimizerCuda::for_each_piece(size_t lo, size_t hi, Fn f) const {
  for (const LocalTensor& t : layout_.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a < b) f(t, a, b);
  }
}

void DistributedOptimizerCuda::start_reduce(float* grads, size_t begin, size_t end) {
  if (!dp_->active() || zero_ || begin >= end) return;
  // One call: NCCL pipelines a large buffer itself, so the CPU's 16 MB buckets are not needed.
  dp_->all_reduce_sum(grads + begin, end - begin, cuda::stream());
  started_.emplace_back(begin, end);
}

void DistributedOptimizerCuda::reduce_gradients(float* grads) {
  if (!dp_->active()) return;
  if (zero_) {
    dp_->reduce_scatter_sum(grads, grad_shard_, shard_end_ - shard_begin_, cuda::stream());
    return;
  }
  std::vector<std::pair<size_t, size_t>> started = started_;
  std::sort(started.begin(), started.end());
  size_t at = 0;
  for (const auto& [begin, end] : started) {
    start_reduce(grads, at, begin);
    at = std::max(at, end);
  }
  start_reduce(grads, at, padded_);
  started_.clear();  // no wait: everything after this on the stream sees the sums
}

double DistributedOptimizerCuda::grad_norm(const float* grads) const {
  double local = 0.0;
  if (zero_ || dp_->rank() == 0) {
    const float* g = reduced(grads);
    for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& t, size_t a, size_t b) {
      if (t.owner) local += cuda::sum_of_squares(g + (a - shard_begin_), b - a);
    });
  }
  double total = local;
  int world_size = 1;
  if (world_ != MPI_COMM_NULL) MPI_Comm_size(world_, &world_size);
  if (world_size > 1) MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, world_);
  return std::sqrt(total);
}

void DistributedOptimizerCuda::step(float* master, cuda::bf16* copy, float* grads, double clip,
                                    double lr, long t) {
  float* g = zero_ ? grad_shard_ : grads;
  const size_t shard = shard_end_ - shard_begin_;
  if (clip < 1.0) cuda::scale(g, shard, float(clip));
  for_each_piece(shard_begin_, shard_end_, [&](const LocalTensor& tensor, size_t a, size_t b) {
    const size_t i = a - shard_begin_;
    cuda::adamw_update(master + a, copy ? copy + a : nullptr, g + i, m_ + i, v_ + i, b - a,
                       layout_.canon(tensor).weight_decay, hyper_, lr, t);
  });
  if (zero_) {
    // In place: this rank's shard is already at its place in the full buffer.
    dp_->all_gather(master + shard_begin_, master, shard, cuda::stream());
    if (copy) dp_->all_gather(copy + shard_begin_, copy, shard, cuda::stream());
  }
}

void DistributedOptimizerCuda::get_moments(std::vector<float>& m, std::vector<float>& v) {
  m.assign(padded_, 0.0f);
  v.assign(padded_, 0.0f);
  const size_t shard = shard_end_ - shard_begin_;
  CUDA_CHECK(cudaMemcpyAsync(m.data() + shard_begin_, m_, shard * sizeof(float),
                             cudaMemcpyDeviceToHost, cuda::stream()));
  CUDA_CHECK(cudaMemcpyAsync(v.data() + shard_begin_, v_, shard * sizeof(float),
                             cudaMemcpyDeviceToHost, cuda::stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  if (!zero_) return;
  // Each dp rank holds its shard: gathered on the host over the dp group's MPI twin, as the CPU
  // twin does (checkpoints are written from host memory).
  MPI_Allgather(MPI_IN_PLACE, int(shard), MPI_FLOAT, m.data(), int(shard), MPI_FLOAT, dp_->mpi());
  MPI_Allgather(MPI_IN_PLACE, int(shard), MPI_FLOAT, v.data(), int(shard), MPI_FLOAT, dp_->mpi());
}

void DistributedOptimizerCuda::set_moments(const std::vector<float>& m,
                                           const std::vector<float>& v) {
  const size_t shard = shard_end_ - shard_begin_;
  CUDA_CHECK(cudaMemcpyAsync(m_, m.data() + shard_begin_, shard * sizeof(float),
                             cudaMemcpyHostToDevice, cuda::stream()));
  CUDA_CHECK(cudaMemcpyAsync(v_, v.data() + shard_begin_, shard * sizeof(float),
                             cudaMemcpyHostToDevice, cuda::stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
}

}  // namespace tessera
