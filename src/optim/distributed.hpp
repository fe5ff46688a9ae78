#pragma once
// The optimizer step of one rank's tile under data parallelism (DESIGN §6), over a backend B
// (backend/backend.hpp): gradients summed over dp (all-reduce started layer by layer during the
// last backward, or ZeRO-1's reduce-scatter), the global gradient norm with every parameter
// counted once, clipping, AdamW, and under ZeRO-1 the all-gather of the parameters.
//
// Precision: the master weights, gradients and Adam moments are fp32 on every backend. Where the
// model reads Backend::Act = bf16, step() also refreshes the bf16 copy of the master (`copy`); where it
// reads fp32 it reads the master itself (copy = nullptr).
#include <cstddef>
#include <utility>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/arena.hpp"
#include "model/shard.hpp"
#include "parallel/comm.hpp"

namespace tessera {

template <class Backend>
class DistributedOptimizer {
 public:
  using Act = typename Backend::Act;

  // dp: this rank's data-parallel group; world: every rank over MPI (the norm's one double).
  // Declares its buffers (moments, the ZeRO-1 gradient shard) in `arena`; bind() once the arena
  // is allocated (it zeroes the moments).
  DistributedOptimizer(const LocalLayout& layout, typename Backend::Comm* dp, Comm* world, bool zero,
                       const AdamWHyper& hyper, Arena& arena);
  void bind();

  // Length of the parameter and gradient buffers: layout.total rounded up to a multiple of dp
  // under ZeRO-1 (equal shards), else layout.total.
  size_t buffer_size() const { return padded_; }

  // Without ZeRO-1: starts summing grads[begin, end) over dp in the background (a layer whose
  // gradients are complete, while the backward pass goes on below it).
  void start_reduce(float* grads, size_t begin, size_t end);
  // Sums the gradients of every dp rank: the ranges not started yet, then waits for all. Under
  // ZeRO-1 reduces and scatters them so this rank holds its shard's sum.
  void reduce_gradients(float* grads);
  // L2 norm of the reduced gradient, every parameter counted exactly once across tp, pp and dp:
  // the step's one wait for the device (the clip factor is decided on the host).
  double grad_norm(const float* grads) const;
  // Scales this rank's gradients (the shard under ZeRO-1) by clip, then AdamW on the master
  // (refreshing `copy` when given); under ZeRO-1 the updated shards of the master (and copy) are
  // all-gathered so every dp rank holds the whole tile again.
  void step(float* master, Act* copy, float* grads, double clip, double lr, long t);

  // Adam moments as full local host buffers (checkpoints): gathered over dp under ZeRO-1.
  void get_moments(std::vector<float>& m, std::vector<float>& v);
  void set_moments(const std::vector<float>& m, const std::vector<float>& v);

  size_t moment_bytes() const { return 2 * (shard_end_ - shard_begin_) * sizeof(float); }
  // Every buffer it declared: the moments, ZeRO-1's gradient shard, the norm's accumulator.
  size_t declared_bytes() const {
    return arena_->bytes(h_norm_) + arena_->bytes(h_m_) + arena_->bytes(h_v_) +
           (zero_ ? arena_->bytes(h_shard_) : 0);
  }

 private:
  // Calls f(tensor, begin, end) for the parts of the local tensors inside [lo, hi).
  template <typename Fn>
  void for_each_piece(size_t lo, size_t hi, Fn f) const;
  const float* reduced(const float* grads) const { return zero_ ? grad_shard_ : grads; }

  const LocalLayout& layout_;
  typename Backend::Comm* dp_;
  Comm* world_;
  bool zero_;
  AdamWHyper hyper_;
  size_t padded_, shard_begin_, shard_end_;
  Arena* arena_;
  size_t h_norm_ = 0, h_m_ = 0, h_v_ = 0, h_shard_ = 0;
  double* norm_ = nullptr;
  float *m_ = nullptr, *v_ = nullptr, *grad_shard_ = nullptr;
  std::vector<std::pair<size_t, size_t>> started_;  // ranges already in flight this step
};

}  // namespace tessera
