#include "optim/sharded_weights.hpp"

#include <algorithm>
#include <stdexcept>

#include "backend/cpu/backend.hpp"
#include "optim/gather_unit.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

ShardedBuffers::ShardedBuffers(const LocalLayout& tile, const ShardPlan& plan, int stage,
                               bool reshard_after_forward, bool fp8, size_t act_bytes,
                               Arena& arena)
    : keep(stage == 3 && !reshard_after_forward), largest(plan.largest_unit), arena(&arena) {
  size_t every = 0;
  for (size_t u = 0; u < plan.part.size(); ++u) {
    kept_offset.push_back(every);
    every += plan.whole(int(u));
  }
  h_grads = arena.add("ZeRO unit gradients (2 units)", 2 * largest * sizeof(float));
  h_parts = arena.add("ZeRO reduced parts (2)", 2 * plan.largest_part * sizeof(float));
  if (keep)
    h_params = arena.add("ZeRO-3 gathered parameters (every unit)", every * act_bytes);
  else if (stage == 3)
    h_params = arena.add("ZeRO-3 gathered parameters (2 units)", 2 * largest * act_bytes);
  else
    h_params = arena.add("ZeRO-2 parameter gather (1 unit)", largest * act_bytes);
  if (stage == 3 && !keep && fp8) {
    codes = fp8_codes_units(tile, plan);
    for (size_t u = 0; u < codes.size(); ++u)
      packed = std::max(packed, size_t(plan.group[u]) * codes[u].packed);
    h_codes = arena.add("ZeRO-3 gathered FP8 weight codes (2 units)", 2 * largest);
    h_packed = arena.add("ZeRO-3 gathered norms and biases, packed (2 units)",
                         2 * packed * act_bytes);
  }
}

size_t ShardedBuffers::bytes() const {
  return arena->bytes(h_params) + arena->bytes(h_grads) + arena->bytes(h_parts) +
         (codes.empty() ? 0 : arena->bytes(h_codes) + arena->bytes(h_packed));
}

template <class Backend>
ShardedWeights<Backend>::ShardedWeights(const LocalLayout& tile, const ShardPlan& plan,
                                        const ShardedBuffers& buffers, Comm* shard,
                                        Comm* expert_shard, int stage, bool prefetch, Arena& arena)
    : tile_(tile), plan_(plan), shard_(shard), expert_shard_(expert_shard), stage_(stage),
      keep_(buffers.keep),
      prefetch_(prefetch),
      largest_(buffers.largest), kept_offset_(buffers.kept_offset),
      gathered_(arena.get<Act>(buffers.h_params)),
      codes_units_(buffers.codes), packed_(buffers.packed),
      codes_(buffers.codes.empty() ? nullptr : arena.get<uint8_t>(buffers.h_codes)),
      packed_values_(buffers.codes.empty() ? nullptr : arena.get<Act>(buffers.h_packed)),
      unit_grads_(arena.get<float>(buffers.h_grads)),
      parts_(arena.get<float>(buffers.h_parts)) {
  gathered_state_.resize(keep_ ? plan.part.size() : 2);
  reducing_.resize(2);
}

template <class Backend>
void ShardedWeights<Backend>::bind(const Act* params, float* grads) {
  source_ = params;
  sums_ = grads;
}

template <class Backend>
void ShardedWeights<Backend>::begin_step() {
  Backend::zero(sums_, plan_.total * sizeof(float));
}

template <class Backend>
void ShardedWeights<Backend>::finish() {
  // The older of the two first: the sums are added in the order the backward released them.
  for (size_t k = 0; k < reducing_.size(); ++k) {
    const size_t b = (turn_ + k) % reducing_.size();
    if (reducing_[b].busy) retire(b);
  }
}

template <class Backend>
void ShardedWeights<Backend>::end_step() {
  for (Gathered& g : gathered_state_) {
    if (g.unit >= 0) finish_gather(g);
    g = Gathered{};
  }
  order_.clear();
  next_ = 0;
}

// --- parameters ---

template <class Backend>
void ShardedWeights<Backend>::start_gather(int unit, size_t buffer) {
  gathered_state_[buffer] = Gathered{};
  if (gathers_codes(unit)) return start_codes_gather(unit, buffer);
  const size_t part = plan_.part[size_t(unit)];
  Act* at = gathered_ + (keep_ ? kept_offset_[size_t(unit)] : buffer * largest_);
  gathered_state_[buffer].unit = unit;
  gathered_state_[buffer].ticket =
      comm(unit)->start_all_gather(source_ + plan_.offset[size_t(unit)], at, part);
}

template <class Backend>
void ShardedWeights<Backend>::start_codes_gather(int unit, size_t buffer) {
  if (!cast_codes) throw std::logic_error("ZeRO-3: FP8 codes to gather and no cast_codes");
  const size_t u = size_t(unit), part = plan_.part[u], me = size_t(plan_.member[u]);
  const CodesUnit& c = codes_units_[u];
  const size_t lo = me * part;  // this rank's part in unit elements
  const Act* mine = source_ + plan_.offset[u];
  // Every weight's cast is called on every rank, with its part empty or not: the first step's
  // scale is reduced over the group.
  uint8_t* codes = codes_ + buffer * largest_;
  for (const CodesUnit::Weight& w : c.weights) {
    const size_t a = std::clamp(w.begin, lo, lo + part), b = std::clamp(w.end, a, lo + part);
    cast_codes(w.layer, w.gemm, mine + (a - lo), b - a, codes + a);
  }
  Act* values = packed_values_ + buffer * packed_;
  size_t k = me * c.packed;
  for (const CodesUnit::Piece& piece : c.pieces[me]) {
    Backend::copy(values + k, mine + (piece.at - lo), piece.n * sizeof(Act));
    k += piece.n;
  }
  Gathered& g = gathered_state_[buffer];
  g.unit = unit;
  g.ticket = comm(unit)->start_all_gather(static_cast<const uint8_t*>(codes + lo), codes, part);
  g.values_ticket =
      c.packed > 0 ? comm(unit)->start_all_gather(static_cast<const Act*>(values + me * c.packed),
                                                  values, c.packed)
                   : -1;
  g.values_pending = true;
}

template <class Backend>
void ShardedWeights<Backend>::finish_gather(Gathered& g) {
  Comm* group = comm(g.unit);
  group->wait(g.ticket);
  g.ticket = -1;
  if (!g.values_pending) return;
  group->wait(g.values_ticket);
  g.values_ticket = -1;
  g.values_pending = false;
  // Each rank's packed values to their places in the unit's parameter buffer.
  const size_t b = size_t(&g - gathered_state_.data());
  const CodesUnit& c = codes_units_[size_t(g.unit)];
  const Act* values = packed_values_ + b * packed_;
  Act* at = gathered_ + b * largest_;
  for (size_t r = 0; r < c.pieces.size(); ++r) {
    size_t k = r * c.packed;
    for (const CodesUnit::Piece& piece : c.pieces[r]) {
      Backend::copy(at + piece.at, values + k, piece.n * sizeof(Act));
      k += piece.n;
    }
  }
}

template <class Backend>
int ShardedWeights<Backend>::free_gather_buffer() const {
  for (size_t b = 0; b < gathered_state_.size(); ++b)
    if (gathered_state_[b].unit < 0) return int(b);
  return -1;
}

template <class Backend>
int ShardedWeights<Backend>::holding(int unit) const {
  if (keep_) return gathered_state_[size_t(unit)].unit == unit ? unit : -1;
  for (size_t b = 0; b < gathered_state_.size(); ++b)
    if (gathered_state_[b].unit == unit && !gathered_state_[b].in_use) return int(b);
  return -1;
}

// Starts the pass's next gathers: while a buffer is free, or (keep_, where every unit has a
// buffer of its own) the next unit not gathered yet this step, one at a time.
template <class Backend>
void ShardedWeights<Backend>::start_next_gather() {
  while (prefetch_ && next_ < order_.size()) {
    const int unit = order_[next_];
    if (keep_) {
      ++next_;
      if (gathered_state_[size_t(unit)].unit >= 0) continue;
      start_gather(unit, size_t(unit));
      return;
    }
    const int b = free_gather_buffer();
    if (b < 0) return;
    start_gather(unit, size_t(b));
    ++next_;
  }
}

template <class Backend>
void ShardedWeights<Backend>::pass(const std::vector<int>& units) {
  if (stage_ != 3) return;
  if (!keep_)
    for (Gathered& g : gathered_state_) {
      if (g.in_use) throw std::logic_error("ZeRO-3: a pass began with a unit still in use");
      if (g.unit >= 0) finish_gather(g);
      g = Gathered{};
    }
  order_ = units;
  next_ = 0;
  start_next_gather();
}

template <class Backend>
const typename Backend::Act* ShardedWeights<Backend>::params(int unit) {
  if (stage_ != 3) return source_ + tile_.units[size_t(unit)].begin;
  int b = holding(unit);
  if (b < 0) {
    start_next_gather();
    b = holding(unit);
  }
  if (b < 0) {
    // Out of the announced order: gathered now.
    b = keep_ ? unit : free_gather_buffer();
    if (b < 0) throw std::logic_error("ZeRO-3: no free buffer to gather a unit into");
    start_gather(unit, size_t(b));
  }
  Gathered& g = gathered_state_[size_t(b)];
  finish_gather(g);
  g.in_use = true;
  start_next_gather();
  return gathered_ + (keep_ ? kept_offset_[size_t(unit)] : size_t(b) * largest_);
}

template <class Backend>
const uint8_t* ShardedWeights<Backend>::codes(int unit) {
  for (size_t b = 0; b < gathered_state_.size(); ++b) {
    const Gathered& g = gathered_state_[b];
    if (g.unit == unit && g.in_use) return gathers_codes(unit) ? codes_ + b * largest_ : nullptr;
  }
  return nullptr;
}

template <class Backend>
void ShardedWeights<Backend>::params_done(int unit) {
  if (stage_ != 3) return;
  for (Gathered& g : gathered_state_)
    if (g.unit == unit && g.in_use) {
      g.in_use = false;
      if (!keep_) g.unit = -1;  // free: the pass's next gather may take it
      break;
    }
  start_next_gather();
  comm(unit)->progress();
}

// --- gradients ---

template <class Backend>
float* ShardedWeights<Backend>::grads(int unit) {
  const size_t b = turn_;
  turn_ = (turn_ + 1) % reducing_.size();
  Reducing& r = reducing_[b];
  if (r.unit >= 0 && !r.busy) throw std::logic_error("ZeRO: a third unit's gradients at once");
  if (r.busy) retire(b);
  float* at = unit_grads_ + b * largest_;
  Backend::zero(at, plan_.whole(unit) * sizeof(float));
  r.unit = unit;
  return at;
}

template <class Backend>
void ShardedWeights<Backend>::grads_done(int unit) {
  for (size_t b = 0; b < reducing_.size(); ++b) {
    Reducing& r = reducing_[b];
    if (r.unit != unit || r.busy) continue;
    const size_t part = plan_.part[size_t(unit)];
    if (before_reduce) before_reduce(unit, unit_grads_ + b * largest_);
    r.ticket = comm(unit)->start_reduce_scatter_sum(
        static_cast<const float*>(unit_grads_ + b * largest_), parts_ + b * plan_.largest_part,
        part);
    r.busy = true;
    comm(unit)->progress();
    return;
  }
  throw std::logic_error("ZeRO: gradients released that were not handed out");
}

template <class Backend>
void ShardedWeights<Backend>::retire(size_t b) {
  Reducing& r = reducing_[b];
  comm(r.unit)->wait(r.ticket);
  const size_t u = size_t(r.unit);
  Backend::add_inplace(sums_ + plan_.offset[u], static_cast<const float*>(parts_ + b * plan_.largest_part),
                       plan_.part[u]);
  r = Reducing{};
}

// --- ZeRO-2's update ---

template <class Backend>
void ShardedWeights<Backend>::gather_full(Act* full) {
  for (size_t u = 0; u < tile_.units.size(); ++u)
    gather_unit<Backend>(tile_, plan_, int(u), full, gathered_, comm(int(u)));
}

template class ShardedWeights<CpuBackend>;
#ifdef TESSERA_CUDA
template class ShardedWeights<CudaBackend<float>>;
template class ShardedWeights<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
