#pragma once
// One rank's tile of the model (docs/models.md): the tensors of its pipeline stage, split by its
// tensor-parallel rank, in one flat local buffer. Every local tensor knows which blocks of the
// canonical tensor it holds, which is all that initialisation, checkpoints and the gradient norm
// need to be layout-free.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/param_layout.hpp"

namespace tessera {

// A block of a canonical tensor seen as 2-D [rows, cols] (a 1-D tensor is [n, 1]).
struct Block {
  size_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

struct LocalTensor {
  size_t canonical = 0;          // index into ParamLayout::tensors
  std::vector<size_t> shape;     // local shape
  size_t offset = 0, numel = 0;  // in the local flat buffer
  std::vector<Block> blocks;     // stacked by local rows, in increasing canonical row order
  bool owner = true;  // the copy that counts (norm, checkpoint): tp rank 0 of replicated tensors,
                      // and stage 0's embedding, not the last stage's tied copy
  // Expert parallelism: a dense tensor's copy on an ep rank but the first, which would own it
  // otherwise. Under ZeRO-2/3 the dense parts spread over the whole dp x cp group, the ep ranks
  // included: each part is then its holder's alone (shard_layout).
  bool ep_copy = false;
};

// Layers [begin, end) of the model.
struct LayerRange {
  int begin = 0, end = 0;
};

// A unit of the parameters, as sharded data parallelism (ZeRO-2 and 3) gathers and reduces them:
// one layer (its tensors are consecutive in the local buffer) or one tensor outside the layers
// (embedding, positions, final norm, untied head). [begin, end) of the local buffer. With expert
// parallelism an MoE layer is two units, its experts' tensors (the layer's last) apart: ZeRO
// shards them over the ranks holding the same experts, the rest of the layer over dp x cp.
struct Unit {
  size_t begin = 0, end = 0;
  bool experts = false;  // an MoE layer's experts under expert parallelism
  size_t size() const { return end - begin; }
};

struct LocalLayout {
  ParamLayout canonical;
  int tp = 1, tp_rank = 0;
  // Expert parallelism (parallel.ep): this rank holds experts [ep_rank E / ep, (ep_rank + 1) E / ep)
  // of each MoE layer, and owns (checkpoints, the gradient norm) its dense tensors only at
  // ep_rank 0 (the other ep ranks hold copies).
  int ep = 1, ep_rank = 0;
  // parallel.expert_tp = 1: the experts whole on every tp rank (not cut by tp), the ep ranks
  // folded over tp x dp x cp; a dense tensor's owners are the ep group's first tp ranks (each
  // holding its tp slice), the other ep ranks hold copies.
  bool experts_whole = false;
  // This stage's layers: one range, or with virtual stages one per chunk (chunk c is virtual
  // stage c * pp + stage), in the local buffer's order.
  std::vector<LayerRange> chunks;
  bool first = true, last = true;       // holds the embedding; holds the final norm and the head
  int vocab_begin = 0, vocab_rows = 0;  // embedding / head rows [vocab_begin, +vocab_rows)
  std::vector<LocalTensor> tensors;
  size_t total = 0;

  // Local tensor indices; -1 where this stage (or the family) has none. The head is the
  // embedding's tied copy (the embedding itself when one stage holds both) or lm_head.
  int embed = -1, positions = -1, norm_weight = -1, norm_bias = -1, head = -1;
  // Layer l's (first) local tensor of a role (model/family.hpp).
  int layer(int l, LayerRole r) const {
    return layer_first_tensor_[size_t(l)] + canonical.position(l, r);
  }
  // Layer l's parameters in the local buffer: [first, end) (its tensors are consecutive).
  std::pair<size_t, size_t> layer_range(int l) const;
  std::vector<int> layer_first_tensor_;  // by model layer: its first local tensor, or -1
  // The units in buffer order, and each local tensor's unit.
  std::vector<Unit> units;
  std::vector<int> unit_of_tensor;
  int layer_unit(int l) const { return unit_of_tensor[size_t(layer_first_tensor_[size_t(l)])]; }
  // Layer l's experts' unit where they are a unit of their own (expert parallelism), else -1.
  int expert_unit(int l) const {
    const size_t u = size_t(layer_unit(l)) + 1;
    return u < units.size() && units[u].experts ? int(u) : -1;
  }

  const ParamTensor& canon(const LocalTensor& t) const { return canonical.tensors[t.canonical]; }
  // Row-major canonical element index of local element i of tensor t.
  size_t canonical_index(const LocalTensor& t, size_t i) const;
  // Real (not padding) vocabulary columns of this rank's logits.
  int vocab_valid() const;
  // Elements of the experts' tensors this tile holds (model/family.hpp's expert_role).
  size_t expert_elements() const;
};

// tp must divide n_head, n_kv_head, ffn_hidden and padded_vocab (checked before, with a message,
// by check_layout).
LocalLayout make_local_layout(const ModelShape& shape, int tp, int tp_rank,
                              const std::vector<LayerRange>& chunks, bool first, bool last,
                              int ep = 1, int ep_rank = 0, bool experts_whole = false);

// One chunk: layers [layer_begin, layer_end).
LocalLayout make_local_layout(const ModelShape& shape, int tp, int tp_rank, int layer_begin,
                              int layer_end, bool first, bool last);

// Sharded data parallelism (ZeRO-2 and 3, docs/parallelism.md): each unit of the tile split into
// equal parts over its group, the last padded, the group's rank r holding part r of every unit,
// one after another in its shard buffer. The group: the shard group (n ranks), or for an
// experts' unit the ranks holding the same experts (expert_n). The same split on every stage
// and tp rank of a tile shape, so that the tied embedding's parts on the first and last stage
// match element for element.
struct ShardPlan {
  std::vector<int> group;      // by unit: the ranks it is split over
  std::vector<int> member;     // by unit: this rank's place among them
  std::vector<size_t> part;    // by unit: elements of each part, ceil(unit size / group)
  std::vector<size_t> offset;  // by unit: where this rank's part starts in the shard buffer
  size_t total = 0;            // elements of the shard buffer: the sum of the parts
  size_t largest_part = 0;     // the largest part of any unit
  size_t largest_unit = 0;     // the largest padded unit: group x part
  // Unit u padded: its group's parts one after another.
  size_t whole(int u) const { return size_t(group[size_t(u)]) * part[size_t(u)]; }
  // This rank's part of unit u as local elements [first, second): at most part[u] of them, fewer
  // (or none) where the part runs past the unit's end into the padding.
  std::pair<size_t, size_t> range(const LocalLayout& tile, int u) const;
};
// n, rank: the shard group; expert_n, expert_rank: the experts' group (where the tile has
// experts' units).
ShardPlan make_shard_plan(const LocalLayout& tile, int n, int rank, int expert_n = 1,
                          int expert_rank = 0);

// ZeRO-3 with FP8 (optim/sharded_weights.hpp): a layer's unit gathered as the one-byte codes of
// its FP8 GEMMs' weights, each rank casting its part, and its other elements (norms, biases) as
// values, packed: each rank's part's ones one after another, padded to the group's largest
// count. The codes travel in unit elements (n x part bytes), the values in n x packed elements.
struct CodesUnit {
  struct Weight {  // a GEMM's weight (model/fp8.hpp's Fp8State::Gemm), unit elements [begin, end)
    size_t begin = 0, end = 0;
    int layer = 0, gemm = 0;
  };
  struct Piece {  // unit elements [at, at + n)
    size_t at = 0, n = 0;
  };
  std::vector<Weight> weights;             // none: the unit is gathered as values
  std::vector<std::vector<Piece>> pieces;  // by group rank: its part's other elements, in order
  size_t packed = 0;                       // the largest of their counts
};
// By unit: the layers' units (not an MoE layer's experts, never in FP8) with their weights.
std::vector<CodesUnit> fp8_codes_units(const LocalLayout& tile, const ShardPlan& plan);

// The tensors' pieces in this rank's parts as a layout whose buffer is the shard buffer: each
// piece a LocalTensor of the canonical tensor, its blocks the canonical rectangles it covers
// (rows split at the part's ends). Initialisation and checkpoints read and write the shard
// through it as they do a whole tile.
LocalLayout shard_layout(const LocalLayout& tile, const ShardPlan& plan);

// Fills the local buffer with this tile of the canonical initialisation.
void init_local_parameters(float* params, const LocalLayout& layout, uint64_t seed, double std);

}  // namespace tessera
