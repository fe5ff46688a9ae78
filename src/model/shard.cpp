#include "model/shard.hpp"

#include <algorithm>

#include "model/init.hpp"

namespace tessera {

size_t LocalLayout::canonical_index(const LocalTensor& t, size_t i) const {
  // The blocks in order, each rows x cols of the local elements (a tile's blocks share their
  // cols; a shard's piece may start and end inside a row).
  const size_t canon_cols = canon(t).shape.size() == 2 ? canon(t).shape[1] : 1;
  for (const Block& b : t.blocks) {
    const size_t n = b.rows * b.cols;
    if (i < n) return (b.row0 + i / b.cols) * canon_cols + b.col0 + i % b.cols;
    i -= n;
  }
  return size_t(-1);
}

std::pair<size_t, size_t> LocalLayout::layer_range(int l) const {
  const int first_tensor = layer_first_tensor_[size_t(l)];
  const LocalTensor& last_tensor =
      tensors[size_t(first_tensor + canonical.layer_tensors(l) - 1)];
  return {tensors[size_t(first_tensor)].offset, last_tensor.offset + last_tensor.numel};
}

int LocalLayout::vocab_valid() const {
  return std::clamp(canonical.shape.vocab_size - vocab_begin, 0, vocab_rows);
}

LocalLayout make_local_layout(const ModelShape& shape, int tp, int tp_rank, int layer_begin,
                              int layer_end, bool first, bool last) {
  return make_local_layout(shape, tp, tp_rank, {{layer_begin, layer_end}}, first, last);
}

LocalLayout make_local_layout(const ModelShape& shape, int tp, int tp_rank,
                              const std::vector<LayerRange>& chunks, bool first, bool last,
                              int ep, int ep_rank, bool experts_whole) {
  LocalLayout L;
  L.canonical = make_param_layout(shape);
  L.tp = tp;
  L.tp_rank = tp_rank;
  L.ep = ep;
  L.ep_rank = ep_rank;
  L.experts_whole = experts_whole;
  // The ep ranks owning the dense tensors: the first (the first tp ranks with whole experts).
  const int dense_owners = experts_whole ? tp : 1;
  L.chunks = chunks;
  L.first = first;
  L.last = last;
  L.vocab_rows = shape.padded_vocab / tp;
  L.vocab_begin = tp_rank * L.vocab_rows;

  auto add = [&](size_t canonical, Split split, bool owner) {
    const ParamTensor& c = L.canonical.tensors[canonical];
    // Whole experts: each tp rank holds its experts' tensors whole (its own, by the folded ep).
    const bool whole = experts_whole && expert_role(c.role);
    if (whole) split = Split::Replicated;
    const size_t rows = c.shape[0], cols = c.shape.size() == 2 ? c.shape[1] : 1;
    LocalTensor t;
    t.canonical = canonical;
    switch (split) {
      case Split::Replicated: t.blocks = {{0, rows, 0, cols}}; break;
      case Split::Rows: t.blocks = {{tp_rank * rows / tp, rows / tp, 0, cols}}; break;
      case Split::Columns: t.blocks = {{0, rows, tp_rank * cols / tp, cols / tp}}; break;
      case Split::QkvRows:  // rows q, k, v of C each; this rank's heads of each
        for (size_t part = 0; part < 3; ++part)
          t.blocks.push_back({part * rows / 3 + tp_rank * rows / 3 / tp, rows / 3 / tp, 0, cols});
        break;
      case Split::PartRows: {
        const size_t n = size_t(c.parts), part_rows = rows / n;
        for (size_t part = 0; part < n; ++part)
          t.blocks.push_back({part * part_rows + tp_rank * part_rows / tp, part_rows / tp, 0, cols});
        break;
      }
    }
    // Expert parallelism: an expert tensor's rows are E equal blocks (one per expert, each
    // cut by tp above); this rank keeps those of its experts. Dense tensors are copies on every
    // ep rank but the first.
    if (ep > 1 && expert_role(c.role)) {
      const size_t E = size_t(shape.moe.experts), per = rows / E;
      const size_t lo = size_t(ep_rank) * (E / size_t(ep)) * per;
      const size_t hi = lo + E / size_t(ep) * per;
      std::vector<Block> kept;
      for (Block b : t.blocks) {
        const size_t r0 = std::max(b.row0, lo), r1 = std::min(b.row0 + b.rows, hi);
        if (r0 < r1) kept.push_back({r0, r1 - r0, b.col0, b.cols});
      }
      t.blocks = kept;
    } else if (ep > 1) {
      t.ep_copy = ep_rank >= dense_owners && owner;
      owner = owner && ep_rank < dense_owners;
    }
    size_t local_rows = 0;
    for (const Block& b : t.blocks) local_rows += b.rows;
    const size_t local_cols = t.blocks.front().cols;
    t.shape = c.shape.size() == 2 ? std::vector<size_t>{local_rows, local_cols}
                                  : std::vector<size_t>{local_rows};
    t.numel = local_rows * local_cols;
    t.offset = L.total;
    t.owner = owner && (split != Split::Replicated || tp_rank == 0 || whole);
    t.ep_copy = t.ep_copy && (split != Split::Replicated || tp_rank == 0);
    L.total += t.numel;
    L.tensors.push_back(std::move(t));
    return int(L.tensors.size()) - 1;
  };

  const ParamLayout& P = L.canonical;
  const bool tied = shape.tied;
  // Vocab-parallel embedding; the last stage's tied copy is not its owner.
  auto split = [&](int tensor) { return P.tensors[size_t(tensor)].split; };
  if (first || (last && tied)) L.embed = add(size_t(P.embed), split(P.embed), first);
  if (first && P.positions >= 0) L.positions = add(size_t(P.positions), split(P.positions), true);
  L.layer_first_tensor_.assign(size_t(shape.n_layer), -1);
  for (const LayerRange& chunk : chunks) {
    for (int l = chunk.begin; l < chunk.end; ++l) {
      L.layer_first_tensor_[size_t(l)] = int(L.tensors.size());
      for (int k = 0; k < P.layer_tensors(l); ++k) {
        const size_t t = size_t(P.layer_begin(l) + k);
        add(t, P.tensors[t].split, true);
      }
    }
  }
  if (last) {
    L.norm_weight = add(size_t(P.norm_weight), split(P.norm_weight), true);
    if (P.norm_bias >= 0) L.norm_bias = add(size_t(P.norm_bias), split(P.norm_bias), true);
    L.head = tied ? L.embed : add(size_t(P.head), split(P.head), true);  // vocab-parallel
  }
  // Each layer one unit (with ep, an MoE layer's experts a second), each tensor outside the
  // layers one of its own.
  std::vector<int> layer_of(L.tensors.size(), -1);
  for (int l = 0; l < shape.n_layer; ++l)
    if (L.layer_first_tensor_[size_t(l)] >= 0) layer_of[size_t(L.layer_first_tensor_[size_t(l)])] = l;
  L.unit_of_tensor.assign(L.tensors.size(), -1);
  auto unit = [&](size_t i, size_t n, bool experts) {
    L.units.push_back({L.tensors[i].offset, L.tensors[i + n - 1].offset + L.tensors[i + n - 1].numel,
                       experts});
    for (size_t k = i; k < i + n; ++k) L.unit_of_tensor[k] = int(L.units.size()) - 1;
  };
  for (size_t i = 0; i < L.tensors.size();) {
    const int l = layer_of[i];
    const size_t n = l >= 0 ? size_t(P.layer_tensors(l)) : 1;
    // The experts' tensors are the layer's last (model/mlp.cpp).
    const size_t dense = ep > 1 && l >= 0 && shape.moe.layer(l) ? size_t(P.position(l, kExpertFc1W)) : n;
    unit(i, dense, false);
    if (dense < n) unit(i + dense, n - dense, true);
    i += n;
  }
  return L;
}

namespace {

// The canonical rectangles of local elements [i0, i1) of tensor t (row-major over its blocks'
// stacked rows): per block a partial first row, the whole rows, a partial last row.
std::vector<Block> rectangles(const LocalTensor& t, size_t i0, size_t i1) {
  std::vector<Block> out;
  size_t at = 0;  // the block's first local element
  for (const Block& b : t.blocks) {
    const size_t n = b.rows * b.cols, lo = std::max(i0, at), hi = std::min(i1, at + n);
    at += n;
    if (lo >= hi) continue;
    size_t r0 = (lo - (at - n)) / b.cols, c0 = (lo - (at - n)) % b.cols;
    const size_t r1 = (hi - (at - n)) / b.cols, c1 = (hi - (at - n)) % b.cols;
    if (r0 == r1) {
      out.push_back({b.row0 + r0, 1, b.col0 + c0, c1 - c0});
      continue;
    }
    if (c0 > 0) out.push_back({b.row0 + r0++, 1, b.col0 + c0, b.cols - c0});
    if (r1 > r0) out.push_back({b.row0 + r0, r1 - r0, b.col0, b.cols});
    if (c1 > 0) out.push_back({b.row0 + r1, 1, b.col0, c1});
  }
  return out;
}

}  // namespace

std::pair<size_t, size_t> ShardPlan::range(const LocalLayout& tile, int u) const {
  const Unit& unit = tile.units[size_t(u)];
  const size_t first =
      std::min(unit.end, unit.begin + size_t(member[size_t(u)]) * part[size_t(u)]);
  return {first, std::min(unit.end, first + part[size_t(u)])};
}

size_t LocalLayout::expert_elements() const {
  size_t n = 0;
  for (const LocalTensor& t : tensors)
    if (expert_role(canon(t).role)) n += t.numel;
  return n;
}

ShardPlan make_shard_plan(const LocalLayout& tile, int n, int rank, int expert_n,
                          int expert_rank) {
  ShardPlan p;
  for (const Unit& u : tile.units) {
    const int g = u.experts ? expert_n : n;
    p.group.push_back(g);
    p.member.push_back(u.experts ? expert_rank : rank);
    p.part.push_back((u.size() + size_t(g) - 1) / size_t(g));
    p.offset.push_back(p.total);
    p.total += p.part.back();
    p.largest_part = std::max(p.largest_part, p.part.back());
    p.largest_unit = std::max(p.largest_unit, size_t(g) * p.part.back());
  }
  return p;
}

std::vector<CodesUnit> fp8_codes_units(const LocalLayout& tile, const ShardPlan& plan) {
  // The linear layers' weights in Fp8State::Gemm order (qkv, proj, fc1, fc2).
  constexpr LayerRole kGemmWeight[] = {kQkvW, kProjW, kFc1W, kFc2W};
  std::vector<CodesUnit> out(tile.units.size());
  for (const LayerRange& chunk : tile.chunks)
    for (int l = chunk.begin; l < chunk.end; ++l) {
      const size_t u = size_t(tile.layer_unit(l));
      const Unit& unit = tile.units[u];
      CodesUnit& c = out[u];
      for (int gemm = 0; gemm < 4; ++gemm) {
        const LayerRole role = kGemmWeight[gemm];
        if (!tile.canonical.has(l, role)) continue;
        // A role's tensors are adjacent (LLaMA's q, k, v): one weight.
        size_t t = size_t(tile.layer(l, role)), end = tile.tensors[t].offset;
        const size_t begin = end;
        for (; t < tile.tensors.size() && tile.canon(tile.tensors[t]).role == role; ++t)
          end = tile.tensors[t].offset + tile.tensors[t].numel;
        c.weights.push_back({begin - unit.begin, end - unit.begin, l, gemm});
      }
      std::sort(c.weights.begin(), c.weights.end(),
                [](const CodesUnit::Weight& a, const CodesUnit::Weight& b) { return a.begin < b.begin; });
      // Each rank's part [r p, (r + 1) p) of the unit, less the weights.
      const size_t p = plan.part[u], size = unit.size();
      c.pieces.resize(size_t(plan.group[u]));
      for (size_t r = 0; r < c.pieces.size(); ++r) {
        size_t at = std::min(size, r * p), count = 0;
        const size_t stop = std::min(size, at + p);
        for (const CodesUnit::Weight& w : c.weights) {
          const size_t to = std::min(stop, std::max(at, w.begin));
          if (to > at) c.pieces[r].push_back({at, to - at}), count += to - at;
          at = std::max(at, std::min(stop, w.end));
        }
        if (stop > at) c.pieces[r].push_back({at, stop - at}), count += stop - at;
        c.packed = std::max(c.packed, count);
      }
    }
  return out;
}

LocalLayout shard_layout(const LocalLayout& tile, const ShardPlan& p) {
  LocalLayout L;
  L.canonical = tile.canonical;
  L.tp = tile.tp;
  L.tp_rank = tile.tp_rank;
  L.chunks = tile.chunks;
  L.first = tile.first;
  L.last = tile.last;
  L.vocab_begin = tile.vocab_begin;
  L.vocab_rows = tile.vocab_rows;
  L.total = p.total;
  for (size_t i = 0; i < tile.tensors.size(); ++i) {
    const LocalTensor& t = tile.tensors[i];
    const int u = tile.unit_of_tensor[i];
    const auto [lo, hi] = p.range(tile, u);
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;
    LocalTensor piece;
    piece.canonical = t.canonical;
    piece.offset = p.offset[size_t(u)] + (a - lo);
    piece.numel = b - a;
    piece.shape = {piece.numel};
    piece.blocks = rectangles(t, a - t.offset, b - t.offset);
    piece.owner = t.owner || t.ep_copy;
    L.tensors.push_back(std::move(piece));
  }
  return L;
}

void init_local_parameters(float* params, const LocalLayout& layout, uint64_t seed, double std) {
  for (const LocalTensor& t : layout.tensors) {
    const ParamTensor& c = layout.canon(t);
    float* p = params + t.offset;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < t.numel; ++i)
      p[i] = init_value(c, layout.canonical.shape, seed, std, layout.canonical_index(t, i));
  }
}

}  // namespace tessera
