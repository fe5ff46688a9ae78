#pragma once
// The optimizer step of one rank's tile under data parallelism (docs/parallelism.md), over a backend B
// (backend/backend.hpp), for each ZeRO stage:
//   0  gradients all-reduced over dp (started layer by layer during the last backward); every
//      dp rank runs AdamW on its whole tile;
//   1  gradients reduce-scattered over the shard group, each rank keeping the Adam moments of
//      1/n of the (padded) flat buffer and updating only that slice, then the parameters
//      all-gathered;
//   2  the gradients arrive reduce-scattered by unit (optim/sharded_weights.hpp) and each rank
//      updates its parts of every unit (ShardPlan), then the parameters are all-gathered;
//   3  as 2, and the parameters stay sharded: a unit is gathered when the model needs it.
// With hybrid sharding (parallel.zero_group) the shard group is zero_group dp ranks and the
// parts' sums are all-reduced across the replica group. The global gradient norm counts every
// parameter once; clipping, AdamW.
//
// Precision: the master weights, gradients and Adam moments are fp32 on every backend. Where the
// model reads Backend::Act = bf16, step() also refreshes the bf16 copy of the master (`copy`);
// where it reads fp32 it reads the master itself (copy = nullptr).
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
  using BComm = typename Backend::Comm;

  // The communicators of the tile: dp (stage 0's sums), shard and replica (stages 1-3: the ZeRO
  // group and the groups holding the same shard), world over MPI (the norm's one double).
  struct Comms {
    BComm* dp;
    BComm* shard;
    BComm* replica;
    Comm* world;
  };
  // plan: stages 2 and 3, this rank's parts (model/shard.hpp). Declares its buffers (the moments,
  // the norm's accumulator) in `arena`; bind() once the arena is allocated (zeroes the moments).
  DistributedOptimizer(const LocalLayout& layout, const Comms& comms, int stage,
                       const ShardPlan* plan, const AdamWHyper& hyper, Arena& arena);
  void bind();

  int stage() const { return stage_; }
  // Elements of the full parameter and gradient buffers: layout.total, rounded up to a multiple
  // of the shard group under ZeRO-1 (equal slices).
  size_t buffer_size() const { return padded_; }
  // Elements of the state this rank holds of the parameters' master weights and moments: the
  // whole (padded) buffer for stages 0 and 1, its parts (ShardPlan::total) for 2 and 3.
  size_t state_size() const { return stage_ >= 2 ? plan_->total : padded_; }

  // Stage 0: starts summing grads[begin, end) over dp in the background (a layer whose gradients
  // are complete, while the backward pass goes on below it).
  void start_reduce(float* grads, size_t begin, size_t end);
  // Stage 0: the sums of every dp rank (the ranges not started yet, then a wait for all); 1: the
  // reduce-scatter into this rank's slice; 1-3: the slice's sums all-reduced across replicas.
  // `grads`: the full buffer (0, 1) or the parts' sums (2, 3).
  void reduce_gradients(float* grads);
  // L2 norm of the reduced gradient, every parameter counted exactly once across tp, pp and dp:
  // the step's one wait for the device (the clip factor is decided on the host).
  double grad_norm(const float* grads) const;
  // Scales this rank's gradients by clip, then AdamW on its master (refreshing `copy` when given):
  //   stages 0, 1: master, copy and grads the full buffers; under ZeRO-1 the updated slices of
  //                the master (and copy) are all-gathered over the shard group;
  //   stage 2:     grads the parts' sums; fp32: master the full parameters, copy null; bf16:
  //                master the parts, copy the full bf16 parameters (the caller all-gathers the
  //                updated parts: ShardedWeights::gather_full);
  //   stage 3:     master, copy (bf16) and grads the parts.
  void step(float* master, Act* copy, float* grads, double clip, double lr, long t);

  // Adam moments as this rank's host state (state_size(): the full local buffers for stages 0
  // and 1, gathered over the shard group under ZeRO-1; the parts for 2 and 3), for checkpoints.
  void get_moments(std::vector<float>& m, std::vector<float>& v);
  void set_moments(const std::vector<float>& m, const std::vector<float>& v);

  size_t moment_bytes() const { return 2 * (shard_end_ - shard_begin_) * sizeof(float); }
  // Every buffer it declared: the moments and the norm's accumulator.
  size_t declared_bytes() const {
    return arena_->bytes(h_norm_) + arena_->bytes(h_m_) + arena_->bytes(h_v_);
  }

 private:
  // Calls f(tensor, local, state, n) for this rank's pieces of the local tensors: n elements at
  // local index `local` of the layout, at index `state` of this rank's state (the moments).
  template <typename Fn>
  void for_each_piece(Fn f) const;

  const LocalLayout& layout_;
  Comms comms_;
  int stage_;
  const ShardPlan* plan_;
  AdamWHyper hyper_;
  size_t padded_, shard_begin_, shard_end_;  // stage 1: this rank's slice of the padded buffer
  Arena* arena_;
  size_t h_norm_ = 0, h_m_ = 0, h_v_ = 0;
  double* norm_ = nullptr;
  float *m_ = nullptr, *v_ = nullptr;
  float* grad_shard_ = nullptr;  // ZeRO-1: where this step's slice of the sums is
  std::vector<std::pair<size_t, size_t>> started_;  // ranges already in flight this step
};

}  // namespace tessera
