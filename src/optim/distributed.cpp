#include "optim/distributed.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "optim/gather_unit.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
DistributedOptimizer<Backend>::DistributedOptimizer(const LocalLayout& layout, const Comms& comms,
                                                    int stage, const ShardPlan* plan,
                                                    const OptimHyper& hyper, Arena& arena)
    : layout_(layout), comms_(comms), stage_(stage == 1 && !comms.shard->active() ? 0 : stage),
      plan_(plan), hyper_(hyper), plan_rule_(plan_rule(hyper, layout)),
      units_1_(stage_ == 1 && layout.ep > 1), arena_(&arena) {
  const size_t n = size_t(comms.shard->size());
  const bool slices = stage_ == 1 && !units_1_;
  padded_ = slices ? (layout.total + n - 1) / n * n : layout.total;
  const size_t slice = slices ? padded_ / n : padded_;
  shard_begin_ = slices ? size_t(comms.shard->rank()) * slice : 0;
  shard_end_ = by_parts() ? plan->total : shard_begin_ + slice;
  if (by_parts()) parts_ = shard_layout(layout, *plan);
  // One padded unit of fp32 (or the narrower copy) where gather_parts gathers a unit.
  if (units_1_)
    h_gather_ = arena.add("ZeRO-1 parameter gather (one unit)", plan->largest_unit * sizeof(float));
  for_each_piece([&](size_t tensor, size_t local, size_t state, size_t count) {
    pieces_.push_back({int(tensor), local, state, count});
  });
  for (const LocalTensor& t : layout.tensors)
    if (expert_role(layout.canon(t).role) && t.numel > 0)
      expert_ranges_.emplace_back(t.offset, t.offset + t.numel);
  h_norm_ = arena.add("gradient norm accumulator", sizeof(double));
  // Each declared state's buffer: Elementwise state at each piece's state index (the slice or
  // parts as they are) where every tensor has it, else packed piece after piece; Rows and Cols
  // one whole vector per matrix of the tile.
  for (const StateSpec& spec : plan_rule_.state) {
    std::vector<size_t> at(spec.whole() ? layout.tensors.size() : pieces_.size(),
                           StateHostLayout::kNone);
    size_t elems = 0;
    if (spec.whole()) {
      for (size_t i = 0; i < layout.tensors.size(); ++i)
        if (const ParamTensor& c = layout.canon(layout.tensors[i]); spec.holds(c)) {
          at[i] = elems;
          elems += spec.numel(c);
        }
    } else if (spec.of == StateOf::Every) {
      for (size_t p = 0; p < pieces_.size(); ++p) at[p] = pieces_[p].state;
      elems = shard_end_ - shard_begin_;
    } else {
      for (size_t p = 0; p < pieces_.size(); ++p)
        if (spec.holds(layout.canon(layout.tensors[size_t(pieces_[p].tensor)]))) {
          at[p] = elems;
          elems += pieces_[p].n;
        }
    }
    state_offset_.push_back(std::move(at));
    state_elems_.push_back(elems);
    h_state_.push_back(arena.add("optimizer state " + spec.name + " (" + spec.dtype + ")",
                                 elems * sizeof(float)));
  }
  for (const auto& [name, bytes] : plan_rule_.work) h_work_.push_back(arena.add(name, bytes));
}

template <class Backend>
void DistributedOptimizer<Backend>::bind() {
  norm_ = arena_->get<double>(h_norm_);
  if (units_1_) gather_ = arena_->get<float>(h_gather_);
  state_.clear();
  state_view_.clear();
  for (size_t k = 0; k < h_state_.size(); ++k) {
    float* base = arena_->get<float>(h_state_[k]);
    Backend::zero(base, state_elems_[k] * sizeof(float));
    state_.push_back(base);
    std::vector<float*> view;
    for (size_t at : state_offset_[k])
      view.push_back(at == StateHostLayout::kNone ? nullptr : base + at);
    state_view_.push_back(std::move(view));
  }
  RuleSetup<Backend> setup;
  setup.tile = &layout_;
  setup.pieces = &pieces_;
  setup.tp = comms_.tp;
  setup.shard = stage_ >= 1 ? comms_.shard : nullptr;
  // By parts the shard group (dp x cp) holds every expert's rows once already: the ep ranks are
  // in it.
  setup.ep = stage_ == 0 && layout_.ep > 1 ? comms_.ep : nullptr;
  for (size_t h : h_work_) setup.work.push_back(arena_->get<void>(h));
  rule_ = make_rule<Backend>(hyper_, setup);
}

template <class Backend>
bool DistributedOptimizer<Backend>::master_sharded() const {
  constexpr bool kFp32 = std::is_same_v<Act, float>;
  return stage_ == 3 || (!kFp32 && (stage_ == 1 || stage_ == 2));
}

template <class Backend>
size_t DistributedOptimizer<Backend>::moment_bytes() const {
  size_t bytes = 0;
  for (size_t h : h_state_) bytes += arena_->bytes(h);
  return bytes;
}

template <class Backend>
size_t DistributedOptimizer<Backend>::declared_bytes() const {
  size_t bytes = arena_->bytes(h_norm_) + moment_bytes();
  if (units_1_) bytes += arena_->bytes(h_gather_);
  for (size_t h : h_work_) bytes += arena_->bytes(h);
  return bytes;
}

template <class Backend>
template <typename Fn>
void DistributedOptimizer<Backend>::for_each_piece(Fn f) const {
  auto pieces = [&](size_t lo, size_t hi, size_t state_at_lo) {
    for (size_t i = 0; i < layout_.tensors.size(); ++i) {
      const LocalTensor& t = layout_.tensors[i];
      const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
      if (a < b) f(i, a, state_at_lo + (a - lo), b - a);
    }
  };
  if (!by_parts()) {
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
  if (!sums_whole() || begin >= end) return;
  // Expert parallelism: the experts' ranges sum over the ranks holding the same experts, the
  // rest over dp x cp. ZeRO-1 with ep sums the whole buffer too and reads its parts of it:
  // its units' parts are not the equal slices of the buffer that one in-place reduce-scatter
  // gives, a reduce-scatter per unit would wait for the backward's end and stage each padded
  // unit, while these sums start layer by layer under the backward (twice a reduce-scatter's
  // bytes, hidden where the backward is longer).
  auto sum = [&](BComm* comm, size_t a, size_t b) {
    if (a < b && comm->active()) comm->start_all_reduce_sum(grads + a, b - a);
  };
  size_t at = begin;
  if (experts_split())
    for (const auto& [a, b] : expert_ranges_) {
      if (b <= at || a >= end) continue;
      sum(comms_.dp, at, std::max(at, a));
      sum(comms_.expert_dp, std::max(at, a), std::min(b, end));
      at = std::min(b, end);
    }
  sum(comms_.dp, at, end);
  started_.emplace_back(begin, end);
}

template <class Backend>
void DistributedOptimizer<Backend>::reduce_gradients(float* grads) {
  if (stage_ == 1 && !units_1_) {
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
  if (experts_split()) comms_.expert_dp->wait_reductions();
  started_.clear();
}

template <class Backend>
double DistributedOptimizer<Backend>::grad_norm(const float* grads) const {
  // Without ZeRO every dp rank holds the same sums: dp rank 0 speaks for its group. Under ZeRO
  // each rank of a shard group counts its slice or parts (the first replica's group speaks for
  // the others). Within those, only owners count (one tp rank for replicated tensors, stage 0
  // for the tied embedding). The pieces add into one device double; the host reads it once.
  Backend::zero(norm_, sizeof(double));
  // With expert parallelism every ep rank of the first group speaks: each owns its experts, and
  // ep rank 0 the dense tensors (model/shard.hpp).
  const bool speaks = stage_ == 0 ? comms_.expert_dp->rank() == 0 : comms_.replica->rank() == 0;
  if (speaks) {
    const float* g = stage_ == 1 && !units_1_ ? grad_shard_ : grads;
    for (const Piece& p : pieces_)
      if (counts(layout_.tensors[size_t(p.tensor)]))
        Backend::sum_of_squares(norm_, g + (sums_whole() ? p.local : p.state), p.n);
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
  float* g = stage_ == 1 && !units_1_ ? grad_shard_ : grads;
  // (ZeRO-1 with ep scales the whole sums, of which it reads its parts.)
  if (clip < 1.0) Backend::scale(g, units_1_ ? padded_ : shard_end_ - shard_begin_, float(clip));
  // Where each piece's master and copy are: at its local index in a full buffer, or at its
  // state index in this rank's slice or parts.
  const bool sharded = master_sharded();
  const bool copy_full = stage_ <= 2;
  StepView<Backend> view;
  view.state = &state_view_;
  view.master.reserve(pieces_.size());
  view.copy.reserve(pieces_.size());
  view.grads.reserve(pieces_.size());
  for (const Piece& p : pieces_) {
    view.master.push_back(master + (sharded ? p.state : p.local));
    view.copy.push_back(copy ? copy + (copy_full ? p.local : p.state) : nullptr);
    view.grads.push_back(g + (sums_whole() ? p.local : p.state));
  }
  rule_->step(view, lr, t - first_step_);
  if (units_1_) {
    gather_parts(sharded ? nullptr : master, copy);
  } else if (stage_ == 1) {
    // In place: this rank's slice is already at its place in the full buffer.
    const size_t slice = shard_end_ - shard_begin_;
    if (!sharded)
      comms_.shard->all_gather(static_cast<const float*>(master + shard_begin_), master, slice);
    if (copy) comms_.shard->all_gather(static_cast<const Act*>(copy + shard_begin_), copy, slice);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::gather_parts(float* master, Act* copy) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    BComm* group = layout_.units[u].experts ? comms_.expert_shard : comms_.shard;
    if (master) gather_unit<Backend>(layout_, *plan_, int(u), master, gather_, group);
    if (copy)
      gather_unit<Backend>(layout_, *plan_, int(u), copy, reinterpret_cast<Act*>(gather_), group);
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::get_state(std::vector<std::vector<float>>& host) {
  const std::vector<StateSpec>& specs = plan_rule_.state;
  host.resize(specs.size());
  const size_t slice = shard_end_ - shard_begin_;
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& spec = specs[k];
    std::vector<float>& out = host[k];
    if (spec.whole()) {
      // Every matrix of the tile, in tile order; by parts those of the parts' tensors.
      out.assign(state_host_layout(spec, state_layout(), state_size()).total, 0.0f);
      if (!by_parts()) {
        Backend::to_host(out.data(), state_[k], state_elems_[k] * sizeof(float));
        continue;
      }
      const StateHostLayout at = state_host_layout(spec, parts_, state_size());
      for (size_t j = 0; j < parts_.tensors.size(); ++j)
        if (at.offset[j] != StateHostLayout::kNone)
          Backend::to_host(out.data() + at.offset[j],
                           state_[k] + state_at(k, tile_tensor(parts_.tensors[j])),
                           spec.numel(parts_.canon(parts_.tensors[j])) * sizeof(float));
      continue;
    }
    out.assign(state_size(), 0.0f);
    if (spec.of == StateOf::Every) {
      Backend::to_host(out.data() + shard_begin_, state_[k], slice * sizeof(float));
    } else {
      for (size_t p = 0; p < pieces_.size(); ++p)
        if (state_at(k, p) != StateHostLayout::kNone)
          Backend::to_host(out.data() + (by_parts() ? pieces_[p].state : pieces_[p].local),
                           state_[k] + state_at(k, p), pieces_[p].n * sizeof(float));
    }
    // Each rank of the shard group holds its slice: gathered on the host over the group's MPI
    // communicator (checkpoints are written from host memory).
    if (stage_ == 1 && !units_1_)
      MPI_Allgather(MPI_IN_PLACE, int(slice), MPI_FLOAT, out.data(), int(slice), MPI_FLOAT,
                    comms_.shard->mpi());
  }
}

template <class Backend>
void DistributedOptimizer<Backend>::set_state(const std::vector<std::vector<float>>& host) {
  const std::vector<StateSpec>& specs = plan_rule_.state;
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& spec = specs[k];
    const std::vector<float>& in = host[k];
    if (spec.whole() && !by_parts()) {
      Backend::to_device(state_[k], in.data(), state_elems_[k] * sizeof(float));
    } else if (spec.whole()) {
      // Every rank keeps every matrix of the tile: the parts' tensors' vectors, each taken from
      // the one rank of the group holding its first element, summed over the group.
      std::vector<float> tile(state_elems_[k], 0.0f);
      const StateHostLayout at = state_host_layout(spec, parts_, state_size());
      for (size_t j = 0; j < parts_.tensors.size(); ++j) {
        const size_t i = tile_tensor(parts_.tensors[j]);
        if (at.offset[j] == StateHostLayout::kNone || !holds_first(i)) continue;
        const size_t n = spec.numel(parts_.canon(parts_.tensors[j]));
        std::copy(in.begin() + long(at.offset[j]), in.begin() + long(at.offset[j] + n),
                  tile.begin() + long(state_at(k, i)));
      }
      if (comms_.shard->active())
        MPI_Allreduce(MPI_IN_PLACE, tile.data(), int(tile.size()), MPI_FLOAT, MPI_SUM,
                      comms_.shard->mpi());
      Backend::to_device(state_[k], tile.data(), tile.size() * sizeof(float));
    } else if (spec.of == StateOf::Every) {
      Backend::to_device(state_[k], in.data() + shard_begin_,
                         (shard_end_ - shard_begin_) * sizeof(float));
    } else {
      for (size_t p = 0; p < pieces_.size(); ++p)
        if (state_at(k, p) != StateHostLayout::kNone)
          Backend::to_device(state_[k] + state_at(k, p),
                             in.data() + (by_parts() ? pieces_[p].state : pieces_[p].local),
                             pieces_[p].n * sizeof(float));
    }
  }
}

template <class Backend>
size_t DistributedOptimizer<Backend>::tile_tensor(const LocalTensor& t) const {
  for (size_t i = 0; i < layout_.tensors.size(); ++i)
    if (layout_.tensors[i].canonical == t.canonical) return i;
  throw std::logic_error("optimizer: a part of a tensor the tile does not hold");
}

template <class Backend>
bool DistributedOptimizer<Backend>::holds_first(size_t i) const {
  // The ep ranks hold different local tensors of a stacked expert tensor, each with a first
  // element: its vectors (the canonical ones, the same on every rank) count from ep rank 0.
  const LocalTensor& t = layout_.tensors[i];
  if (layout_.ep_rank > 0 && expert_role(layout_.canon(t).role)) return false;
  for (const Piece& p : pieces_)
    if (size_t(p.tensor) == i && p.local == layout_.tensors[i].offset) return true;
  return false;
}

template class DistributedOptimizer<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp).
template DistributedOptimizer<DeclareBackend<float>>::DistributedOptimizer(
    const LocalLayout&, const Comms&, int, const ShardPlan*, const OptimHyper&, Arena&);
template DistributedOptimizer<DeclareBackend<Bf16Bytes>>::DistributedOptimizer(
    const LocalLayout&, const Comms&, int, const ShardPlan*, const OptimHyper&, Arena&);
template bool DistributedOptimizer<DeclareBackend<float>>::master_sharded() const;
template bool DistributedOptimizer<DeclareBackend<Bf16Bytes>>::master_sharded() const;
template size_t DistributedOptimizer<DeclareBackend<float>>::moment_bytes() const;
template size_t DistributedOptimizer<DeclareBackend<Bf16Bytes>>::moment_bytes() const;
template size_t DistributedOptimizer<DeclareBackend<float>>::declared_bytes() const;
template size_t DistributedOptimizer<DeclareBackend<Bf16Bytes>>::declared_bytes() const;
#ifdef TESSERA_CUDA
template class DistributedOptimizer<CudaBackend<float>>;
template class DistributedOptimizer<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
