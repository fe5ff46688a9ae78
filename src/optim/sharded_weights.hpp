#pragma once
// The model's parameters and gradients under ZeRO-2 and 3 (docs/parallelism.md), unit by unit
// (model/weights.hpp): each rank of the shard group holds one part of every unit (ShardPlan,
// model/shard.hpp) of the gradient sums, and under ZeRO-3 of the parameters too.
//
// Gradients: a unit's backward adds into a zeroed transient buffer of the whole unit; on release
// the buffer is reduce-scattered over the shard group (started now, finished when its buffer is
// next needed or at finish()) and this rank's part added to its sum: every micro-batch's
// gradients reach their owners as the backward produces them, so no rank ever holds the whole
// gradient. Two such buffers take turns.
//
// Parameters (ZeRO-3): a unit's parameters are all-gathered into a transient buffer just before
// it computes. The pass's order is known (Weights::pass), so the next unit's gather is started as
// soon as a buffer is free, while the current unit computes: two buffers, at most two units'
// parameters gathered at a time. With reshard_after_forward = false every unit keeps its
// gathered parameters from its first use until the step ends (end_step), in a buffer of its own.
// ZeRO-2 reads the full parameter buffer the optimizer keeps up to date.
//
// FP8 (with resharding): a layer's GEMM weights are gathered as their one-byte codes, half a
// bf16 gather's bytes (a quarter of fp32's), as FSDP2 with float8 does: each rank casts its part
// (cast_codes: Fp8Linear::cast_part, the scale every rank of the tile uses) into its place in the
// unit's codes, all-gathers them, and the GEMMs place the gathered codes (model/fp8.hpp) instead
// of casting the whole weight. The unit's other elements (norms, biases) travel as values,
// packed (CodesUnit, model/shard.hpp), and land at their places in the parameter buffer.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/arena.hpp"
#include "model/shard.hpp"
#include "model/weights.hpp"

namespace tessera {

// The transient buffers of ShardedWeights, declared in the engine's arena (what `tessera plan`
// counts): two units' gradients and their reduced parts, and under ZeRO-3 two units' gathered
// parameters (every unit's, without resharding) or under ZeRO-2 one unit's for the update's
// gather. act_bytes: the size of the parameters' element type.
struct ShardedBuffers {
  // fp8: device.precision fp8 (the layers' weights gathered as codes under ZeRO-3).
  ShardedBuffers(const LocalLayout& tile, const ShardPlan& plan, int stage,
                 bool reshard_after_forward, bool fp8, size_t act_bytes, Arena& arena);
  size_t bytes() const;
  bool keep;                         // ZeRO-3 without resharding
  std::vector<CodesUnit> codes;      // FP8 under ZeRO-3 with resharding, else empty
  size_t packed = 0;                 // the largest packed gather of a unit (n x packed values)
  size_t h_codes = 0, h_packed = 0;
  size_t largest = 0;                // elements of the largest gathered unit (n parts of it)
  std::vector<size_t> kept_offset;   // keep: where each unit's gathered parameters are
  size_t h_params = 0, h_grads = 0, h_parts = 0;
  const Arena* arena;
};

template <class Backend>
class ShardedWeights final : public Weights<typename Backend::Act> {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // stage 2 or 3; shard: the ZeRO group, expert_shard: the ranks holding the same experts (the
  // experts' units' group, ShardPlan); buffers declared in `arena`, which must be allocated.
  // prefetch: start the pass's next gathers ahead (parallel.zero_prefetch).
  ShardedWeights(const LocalLayout& tile, const ShardPlan& plan, const ShardedBuffers& buffers,
                 Comm* shard, Comm* expert_shard, int stage, bool prefetch, Arena& arena);
  // params: ZeRO-2's full parameter buffer (the layout's offsets), or ZeRO-3's shard of them
  // (the gather source, plan.total); grads: this rank's gradient sums (plan.total).
  void bind(const Act* params, float* grads);

  // The step's start (the sums zeroed) and the end of its backward passes (every
  // reduce-scatter finished and added); end_step drops the gathered parameters that
  // reshard_after_forward = false kept.
  void begin_step();
  void finish();
  void end_step();

  // Called with a unit's gradients (the whole unit) just before they are reduce-scattered: the
  // engine sums sequence parallelism's partial norm gradients over tp there, once per
  // micro-batch, so that every rank of the group hands tp the same amount.
  std::function<void(int unit, float* grads)> before_reduce;

  // FP8 (ShardedBuffers::codes): casts this rank's n elements x of layer's weight `gemm` into
  // out with the step's scale (Fp8Linear::cast_part).
  std::function<void(int layer, int gemm, const Act* x, size_t n, uint8_t* out)> cast_codes;

  void pass(const std::vector<int>& units) override;
  const Act* params(int unit) override;
  const uint8_t* codes(int unit) override;
  void params_done(int unit) override;
  float* grads(int unit) override;
  void grads_done(int unit) override;

  // ZeRO-2 after the update, which wrote this rank's parts in place: every unit's parts
  // all-gathered, so that every rank of the group holds the whole buffer `full` again.
  void gather_full(Act* full);

 private:
  struct Gathered {         // a parameter buffer
    int unit = -1;          // the unit it holds or gathers; -1: free
    int ticket = -1;        // its gather in flight; -1 once waited for
    int values_ticket = -1; // codes: the packed values' gather
    bool values_pending = false;  // codes: the values not at their places yet
    bool in_use = false;    // handed out by params() and not released yet
  };
  struct Reducing {         // a gradient buffer
    int unit = -1;          // the unit whose gradients it holds; -1: free
    int ticket = -1;        // its reduce-scatter
    bool busy = false;      // released: the reduce-scatter is in flight
  };
  void start_gather(int unit, size_t buffer);
  void start_codes_gather(int unit, size_t buffer);
  // The unit's weights gathered as codes (CodesUnit), its other values packed.
  bool gathers_codes(int unit) const {
    return !codes_units_.empty() && !codes_units_[size_t(unit)].weights.empty();
  }
  void finish_gather(Gathered& g);  // waits for its gathers; codes: the values to their places
  int free_gather_buffer() const;
  int holding(int unit) const;  // the buffer holding (or gathering) unit, not handed out; or -1
  void start_next_gather();
  void retire(size_t buffer);  // finishes the reduce-scatter of gradient buffer `buffer`

  const LocalLayout& tile_;
  const ShardPlan& plan_;
  Comm* shard_;
  Comm* expert_shard_;
  Comm* comm(int unit) const { return tile_.units[size_t(unit)].experts ? expert_shard_ : shard_; }
  int stage_;
  bool keep_;  // reshard_after_forward = false
  bool prefetch_;
  size_t largest_;  // elements of the largest gathered unit (n parts of its part size)
  const std::vector<size_t>& kept_offset_;  // keep_: where each unit's gathered parameters are
  const Act* source_ = nullptr;
  float* sums_ = nullptr;
  Act* gathered_ = nullptr;  // 2 x largest_, or (keep_) every unit's n parts one after another
  const std::vector<CodesUnit>& codes_units_;
  size_t packed_;              // elements of each buffer's packed values
  uint8_t* codes_ = nullptr;   // FP8: 2 x largest_ codes
  Act* packed_values_ = nullptr;  // FP8: 2 x packed_
  float* unit_grads_ = nullptr;  // 2 x largest_
  float* parts_ = nullptr;       // 2 x plan.largest_part: what a reduce-scatter hands this rank
  std::vector<Gathered> gathered_state_;
  std::vector<Reducing> reducing_;
  std::vector<int> order_;  // the pass's units
  size_t next_ = 0;         // the first unit of order_ whose gather is not started
  size_t turn_ = 0;         // the gradient buffer to take next
};

}  // namespace tessera
