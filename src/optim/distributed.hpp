#pragma once
// The distribution strategy of the optimizer step (docs/parallelism.md): one rank's tile under data
// parallelism, over a backend B (backend/backend.hpp), for each ZeRO stage, around an update rule
// (optim/rule.hpp: AdamW, Adafactor) whose declared state it holds and shards:
//   0  gradients all-reduced over dp (started layer by layer during the last backward); every
//      dp rank updates its whole tile;
//   1  gradients reduce-scattered over the shard group, each rank keeping the rule's state of
//      1/n of the (padded) flat buffer and updating only that slice, then the parameters
//      all-gathered. With expert parallelism the ep ranks hold different experts at the same
//      offsets, so the slices are the units' parts instead (ShardPlan, as stage 2: the experts'
//      over edp, the rest over dp x cp): the gradients all-reduced as at stage 0, each rank
//      updating its parts, which are then all-gathered unit by unit;
//   2  the gradients arrive reduce-scattered by unit (optim/sharded_weights.hpp) and each rank
//      updates its parts of every unit (ShardPlan), then the parameters are all-gathered;
//   3  as 2, and the parameters stay sharded: a unit is gathered when the model needs it.
// With hybrid sharding (parallel.zero_group) the shard group is zero_group dp ranks and the
// parts' sums are all-reduced across the replica group. The global gradient norm counts every
// parameter once; clipping, then the rule.
//
// The rule's state: Elementwise state (one value per parameter) is held for this rank's pieces
// only (the slice or parts; the whole tile at stage 0), packed where the rule keeps it for some
// tensors only; Rows / Cols state whole for every matrix of the tile (StateSpec).
//
// Precision: the master weights, gradients and the rule's state are fp32 on every backend. Where
// the model reads Backend::Act = bf16, step() also refreshes the bf16 copy of the master
// (`copy`), and the master is held where the state is: under ZeRO-1 and 2 only this rank's slice
// or parts of it (Megatron's distributed optimizer), the copy whole. Where the model reads fp32
// it reads the master itself (copy = nullptr), whole below stage 3.
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/arena.hpp"
#include "model/shard.hpp"
#include "optim/rule.hpp"
#include "parallel/comm.hpp"

namespace tessera {

template <class Backend>
class DistributedOptimizer {
 public:
  using Act = typename Backend::Act;
  using BComm = typename Backend::Comm;

  // The communicators of the tile: tp (the rule's sums over a tensor's tp shards), dp (stage 0's
  // sums), shard and replica (stages 1-3: the ZeRO group and the groups holding the same shard),
  // world over MPI (the norm's one double), ep (stage 0: the rule's sums over the ranks holding
  // the other experts' rows of a stacked expert tensor).
  struct Comms {
    BComm* dp;
    BComm* shard;
    BComm* replica;
    Comm* world;
    BComm* tp;
    // The ranks holding the same experts: the experts' gradients reduce over them (dp without
    // expert parallelism); expert_shard, those of them in this rank's ZeRO group, split the
    // experts' units (expert_dp itself without hybrid sharding).
    BComm* expert_dp;
    BComm* expert_shard;
    BComm* ep;
  };
  // plan: stages 2 and 3, and stage 1 with expert parallelism: this rank's parts
  // (model/shard.hpp). Declares its buffers (the rule's
  // state and working buffers, the norm's accumulator) in `arena`; bind() once the arena is
  // allocated (zeroes the state, builds the rule).
  DistributedOptimizer(const LocalLayout& layout, const Comms& comms, int stage,
                       const ShardPlan* plan, const OptimHyper& hyper, Arena& arena);
  void bind();

  int stage() const { return stage_; }
  std::string rule() const { return deck_word(hyper_.rule); }
  // Elements of the full parameter and gradient buffers: layout.total, rounded up to a multiple
  // of the shard group under ZeRO-1 (equal slices).
  size_t buffer_size() const { return padded_; }
  // Elements of the state this rank holds of the parameters' master weights and moments, as the
  // host sees it: the whole (padded) buffer for stages 0 and 1, its parts (ShardPlan::total) for
  // 2 and 3 and for 1 with ep (by_parts); laid out as state_layout(): the tile, or its parts
  // (shard_layout).
  size_t state_size() const { return by_parts() ? plan_->total : padded_; }
  const LocalLayout& state_layout() const { return by_parts() ? parts_ : layout_; }
  // Whether this rank holds the state of its parts of the units (ShardPlan): ZeRO-2/3, and
  // ZeRO-1 with expert parallelism.
  bool by_parts() const { return stage_ >= 2 || units_1_; }
  // Whether the gradients are all-reduced whole, started layer by layer during the backward
  // (start_reduce): stage 0, and stage 1 with expert parallelism.
  bool sums_whole() const { return stage_ == 0 || units_1_; }
  // Elements of this rank's slice (ZeRO-1) or parts (2, 3) of the buffer; the whole at stage 0.
  size_t shard_elements() const { return shard_end_ - shard_begin_; }
  size_t shard_begin() const { return shard_begin_; }  // ZeRO-1: where the slice starts
  // Where the fp32 master is only this rank's slice or parts of the parameters (Act = bf16 at
  // stages 1 and 2; every type at stage 3): the master buffer holds shard_elements().
  bool master_sharded() const;

  // sums_whole(): starts summing grads[begin, end) over dp in the background (a layer whose
  // gradients are complete, while the backward pass goes on below it).
  void start_reduce(float* grads, size_t begin, size_t end);
  // sums_whole(): the sums of every dp rank (the ranges not started yet, then a wait for all);
  // 1: the reduce-scatter into this rank's slice; 1-3: the slice's sums all-reduced across
  // replicas.
  // `grads`: the full buffer (0, 1) or the parts' sums (2, 3).
  void reduce_gradients(float* grads);
  // L2 norm of the reduced gradient, every parameter counted exactly once across tp, pp and dp:
  // the step's one wait for the device (the clip factor is decided on the host).
  double grad_norm(const float* grads) const;
  // Scales this rank's gradients by clip, then the rule's update of its pieces at step t - the
  // first step of the state (set_first_step), refreshing `copy` where given:
  //   stages 0, 1: copy and grads the full buffers, master the full buffer or (sharded) the
  //                slice; under ZeRO-1 the updated slices of the full master or of the copy are
  //                all-gathered over the shard group; with ep (by_parts) the parts' updated
  //                master (fp32) or copy (bf16), master the parts in bf16 (gather_parts);
  //   stage 2:     grads the parts' sums; fp32: master the full parameters, copy null; bf16:
  //                master the parts, copy the full bf16 parameters (the caller all-gathers the
  //                updated parts: ShardedWeights::gather_full);
  //   stage 3:     master, copy (bf16) and grads the parts.
  void step(float* master, Act* copy, float* grads, double clip, double lr, long t);
  // The step before which the rule's state began (0: the run's first; a restart that reset the
  // state: the checkpoint's step), so that the rule counts its own steps from 1.
  void set_first_step(long step) { first_step_ = step; }
  long first_step() const { return first_step_; }

  // ZeRO-1 with expert parallelism: this rank's parts of every unit, in place in the full
  // buffers (the fp32 master, the bf16 copy), all-gathered unit by unit over the unit's group,
  // so that every rank holds the whole buffers again.
  // master: the full fp32 master where it is not sharded (else only copy is gathered).
  void gather_parts(float* master, Act* copy);

  // The rule's state, one host buffer per declared tensor (state_host_layout over
  // state_layout(), of state_size() for Elementwise): gathered over the shard group under
  // ZeRO-1; for checkpoints. set_state takes the same (all zero: a fresh state).
  const std::vector<StateSpec>& state_specs() const { return plan_rule_.state; }
  void get_state(std::vector<std::vector<float>>& host);
  void set_state(const std::vector<std::vector<float>>& host);

  // The bytes of the rule's state on this rank.
  size_t moment_bytes() const;
  // Every buffer it declared: the rule's state and working buffers, the norm's accumulator.
  size_t declared_bytes() const;

 private:
  // Calls f(tensor index, local, state, n) for this rank's pieces of the local tensors: n
  // elements at local index `local` of the layout, at index `state` of this rank's state.
  template <typename Fn>
  void for_each_piece(Fn f) const;
  // Where spec k's values of piece p (Elementwise) or of tile tensor i (Rows, Cols) are in its
  // buffer; kNone where it has none.
  size_t state_at(size_t k, size_t index) const { return state_offset_[k][index]; }
  // The tile tensor a part's tensor belongs to; whether this rank holds tile tensor i's first
  // element (one rank of the shard group does; of a stacked expert tensor, one at ep rank 0).
  size_t tile_tensor(const LocalTensor& t) const;
  bool holds_first(size_t i) const;
  // Whether this rank's pieces of tile tensor t count in the norm: its owner's, and by parts
  // (ZeRO-2/3, ZeRO-1 with ep) also an ep rank's copy of a dense tensor, whose parts are its own
  // (model/shard.hpp).
  bool counts(const LocalTensor& t) const { return t.owner || (by_parts() && t.ep_copy); }

  const LocalLayout& layout_;
  Comms comms_;
  int stage_;
  const ShardPlan* plan_;
  OptimHyper hyper_;
  RulePlan plan_rule_;
  bool units_1_;       // stage 1 by the units' parts (expert parallelism)
  LocalLayout parts_;  // by_parts(): this rank's parts as a layout (shard_layout)
  size_t padded_, shard_begin_, shard_end_;  // stage 1: this rank's slice of the padded buffer
  Arena* arena_;
  std::vector<Piece> pieces_;
  std::vector<std::vector<size_t>> state_offset_;  // [spec][piece or tile tensor]
  std::vector<size_t> state_elems_;               // [spec]: elements of its buffer
  size_t h_norm_ = 0, h_gather_ = 0;
  float* gather_ = nullptr;  // units_1_: one padded unit, where gather_parts gathers
  std::vector<size_t> h_state_, h_work_;
  double* norm_ = nullptr;
  std::vector<float*> state_;                      // [spec]: its buffer
  std::vector<std::vector<float*>> state_view_;    // StepView::state
  std::unique_ptr<UpdateRule<Backend>> rule_;
  long first_step_ = 0;
  float* grad_shard_ = nullptr;  // ZeRO-1: where this step's slice of the sums is
  std::vector<std::pair<size_t, size_t>> started_;  // ranges already in flight this step
  // Expert parallelism: the local ranges of the experts' tensors, in buffer order.
  std::vector<std::pair<size_t, size_t>> expert_ranges_;
  bool experts_split() const { return comms_.expert_dp != comms_.dp; }
};

}  // namespace tessera
