#pragma once
// The optimizer step of one rank's tile under data parallelism (DESIGN §6): gradients summed
// over dp (bucketed all-reduce, or ZeRO-1's reduce-scatter), the global gradient norm with every
// parameter counted once, clipping, AdamW, and under ZeRO-1 the all-gather of the parameters.
#include <mpi.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "model/shard.hpp"
#include "optim/adamw.hpp"
#include "parallel/comm.hpp"

namespace tessera {

class DistributedOptimizer {
 public:
  // dp: this rank's data-parallel group; world: every rank (norm reduction).
  DistributedOptimizer(const LocalLayout& layout, Comm* dp, Comm* world, bool zero,
                       const AdamWHyper& hyper);

  // Length of the parameter and gradient buffers: layout.total rounded up to a multiple of dp
  // under ZeRO-1 (equal shards), else layout.total.
  size_t buffer_size() const { return padded_; }

  // Without ZeRO-1: starts summing grads[begin, end) over dp in the background (a layer whose
  // gradients are complete, while the backward pass goes on below it).
  void start_reduce(float* grads, size_t begin, size_t end);
  // Sums the gradients of every dp rank: the ranges not started yet, in buckets, then waits for
  // all. Under ZeRO-1 reduces and scatters them so this rank holds its shard's sum.
  void reduce_gradients(float* grads);
  // L2 norm of the reduced gradient, every parameter counted exactly once across tp, pp and dp.
  double grad_norm(const float* grads) const;
  // Scales this rank's gradients (the shard under ZeRO-1), then AdamW; under ZeRO-1 the updated
  // shards are all-gathered so every dp rank holds the whole tile again.
  void step(float* params, float* grads, double clip, double lr, long t);

  // Adam moments as full local buffers (checkpoints): gathered over dp under ZeRO-1.
  void get_moments(std::vector<float>& m, std::vector<float>& v);
  void set_moments(const std::vector<float>& m, const std::vector<float>& v);

  size_t moment_bytes() const { return 2 * m_.size() * sizeof(float); }

 private:
  // Calls f(tensor, begin, end) for the parts of the local tensors inside [lo, hi).
  template <typename F>
  void for_each_piece(size_t lo, size_t hi, F f) const;
  const float* reduced(const float* grads) const { return zero_ ? grad_shard_.data() : grads; }

  const LocalLayout& layout_;
  Comm* dp_;
  Comm* world_;
  bool zero_;
  AdamWHyper hyper_;
  size_t padded_, shard_begin_, shard_end_;
  std::vector<float> m_, v_, grad_shard_;
  std::vector<MPI_Request> pending_;
  std::vector<std::pair<size_t, size_t>> started_;  // ranges already in flight this step
};

}  // namespace tessera
