// ZeRO-2/3's split of a tile into parts (model/shard.hpp, ShardPlan): every element of the tile
// in exactly one rank's part, each piece's canonical rectangles naming the elements it holds, so
// that initialisation and checkpoints through the parts' layout see the tile's values.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "model/param_layout.hpp"
#include "model/shard.hpp"

using namespace tessera;

namespace {

// The tiles the checks walk: GPT-2 (tied, a first and a last stage, tp 2 with q/k/v rows and
// column splits) and LLaMA (untied head, grouped-query heads).
std::vector<LocalLayout> tiles() {
  std::vector<LocalLayout> out;
  const ModelShape gpt = make_model_shape(4, 4, 32, 16, 70, 64);
  ModelConfig llama_config;
  llama_config.arch = Arch::Llama;
  llama_config.n_layer = 3;
  llama_config.n_head = 4;
  llama_config.n_kv_head = 2;
  llama_config.n_embd = 32;
  llama_config.block_size = 16;
  llama_config.ffn_multiple = 16;
  const ModelShape llama = make_model_shape(llama_config, 70);
  out.push_back(make_local_layout(gpt, 1, 0, 0, 4, true, true));
  out.push_back(make_local_layout(gpt, 2, 1, 0, 2, true, false));
  out.push_back(make_local_layout(gpt, 2, 0, 2, 4, false, true));
  out.push_back(make_local_layout(llama, 2, 1, 0, 3, true, true));
  return out;
}

// This rank's parts of a local buffer, laid out as its shard buffer.
std::vector<float> parts_of(const LocalLayout& tile, const ShardPlan& plan,
                            const std::vector<float>& local) {
  std::vector<float> shard(plan.total, -1.0f);
  for (size_t u = 0; u < tile.units.size(); ++u) {
    const auto [lo, hi] = plan.range(tile, int(u));
    for (size_t x = lo; x < hi; ++x) shard[plan.offset[u] + (x - lo)] = local[x];
  }
  return shard;
}

}  // namespace

TEST(ShardPlan, UnitsCoverTheTileInOrder) {
  for (const LocalLayout& tile : tiles()) {
    size_t at = 0;
    for (const Unit& u : tile.units) {
      EXPECT_EQ(u.begin, at);
      at = u.end;
    }
    EXPECT_EQ(at, tile.total);
    for (size_t i = 0; i < tile.tensors.size(); ++i) {
      const Unit& u = tile.units[size_t(tile.unit_of_tensor[i])];
      EXPECT_GE(tile.tensors[i].offset, u.begin);
      EXPECT_LE(tile.tensors[i].offset + tile.tensors[i].numel, u.end);
    }
  }
}

// Every element of the tile is in exactly one rank's part, and the part's layout names it by the
// canonical index the tile gives it.
TEST(ShardPlan, PartsHoldEveryElementOnceUnderItsCanonicalIndex) {
  for (const LocalLayout& tile : tiles()) {
    // Each local element's (canonical tensor, canonical index).
    std::vector<std::pair<size_t, size_t>> name(tile.total);
    for (const LocalTensor& t : tile.tensors)
      for (size_t i = 0; i < t.numel; ++i)
        name[t.offset + i] = {t.canonical, tile.canonical_index(t, i)};
    std::vector<float> local(tile.total);
    for (size_t x = 0; x < local.size(); ++x) local[x] = float(x);
    for (int n : {1, 2, 3, 4, 7}) {
      std::vector<int> seen(tile.total, 0);
      for (int r = 0; r < n; ++r) {
        const ShardPlan plan = make_shard_plan(tile, n, r);
        const LocalLayout layout = shard_layout(tile, plan);
        const std::vector<float> shard = parts_of(tile, plan, local);
        size_t elements = 0;
        for (const LocalTensor& piece : layout.tensors) {
          for (size_t i = 0; i < piece.numel; ++i) {
            const size_t x = size_t(shard[piece.offset + i]);  // the local element it holds
            ASSERT_LT(x, tile.total);
            EXPECT_EQ(name[x].first, piece.canonical);
            EXPECT_EQ(name[x].second, layout.canonical_index(piece, i))
                << "n=" << n << " rank " << r << " piece of tensor " << piece.canonical;
            seen[x]++;
          }
          elements += piece.numel;
        }
        EXPECT_LE(elements, plan.total);
      }
      for (size_t x = 0; x < tile.total; ++x)
        ASSERT_EQ(seen[x], 1) << "n=" << n << " element " << x;
    }
  }
}

// Initialisation through the parts' layout gives each element the tile's value.
TEST(ShardPlan, InitialisationOfThePartsEqualsTheTiles) {
  for (const LocalLayout& tile : tiles()) {
    std::vector<float> whole(tile.total);
    init_local_parameters(whole.data(), tile, 1337, 0.02);
    for (int n : {2, 3}) {
      for (int r = 0; r < n; ++r) {
        const ShardPlan plan = make_shard_plan(tile, n, r);
        const LocalLayout layout = shard_layout(tile, plan);
        std::vector<float> mine(plan.total, 0.0f);
        init_local_parameters(mine.data(), layout, 1337, 0.02);
        const std::vector<float> expected = parts_of(tile, plan, whole);
        for (const LocalTensor& piece : layout.tensors)
          for (size_t i = 0; i < piece.numel; ++i)
            ASSERT_EQ(mine[piece.offset + i], expected[piece.offset + i]);
      }
    }
  }
}

// FP8 under ZeRO-3 (CodesUnit): in a layer's unit every element is either in the range of the
// one FP8 GEMM weight whose tensor holds it (Fp8State::Gemm of its role, its layer) or in a
// piece of exactly the rank whose part holds it, pieces in order; the packed count is the
// largest rank's; the units outside the layers have no weights.
TEST(ShardPlan, Fp8CodesUnitsSplitEachLayerIntoWeightsAndPackedValues) {
  const std::map<LayerRole, int> gemm_of = {{kQkvW, 0}, {kProjW, 1}, {kFc1W, 2}, {kFc2W, 3}};
  for (const LocalLayout& tile : tiles())
    for (int n : {1, 2, 3, 5, 7}) {
      const ShardPlan plan = make_shard_plan(tile, n, 0);
      const std::vector<CodesUnit> codes = fp8_codes_units(tile, plan);
      ASSERT_EQ(codes.size(), tile.units.size());
      std::vector<bool> layer_unit(tile.units.size(), false);
      for (const LayerRange& chunk : tile.chunks)
        for (int l = chunk.begin; l < chunk.end; ++l) layer_unit[size_t(tile.layer_unit(l))] = true;
      for (size_t u = 0; u < tile.units.size(); ++u) {
        const CodesUnit& c = codes[u];
        if (!layer_unit[u]) {
          EXPECT_TRUE(c.weights.empty() && c.packed == 0) << "unit " << u;
          continue;
        }
        const Unit& unit = tile.units[u];
        ASSERT_EQ(c.weights.size(), 4u) << "unit " << u;
        std::vector<int> seen(unit.size(), 0);
        for (const CodesUnit::Weight& w : c.weights)
          for (size_t e = w.begin; e < w.end; ++e) {
            const size_t x = unit.begin + e;
            const auto t = std::find_if(tile.tensors.begin(), tile.tensors.end(), [&](const LocalTensor& t) {
              return x >= t.offset && x < t.offset + t.numel;
            });
            ASSERT_NE(t, tile.tensors.end());
            const LayerRole role = tile.canon(*t).role;
            ASSERT_TRUE(gemm_of.count(role)) << "unit " << u << " element " << e;
            EXPECT_EQ(gemm_of.at(role), w.gemm);
            EXPECT_GE(x, tile.layer_range(w.layer).first);
            EXPECT_LT(x, tile.layer_range(w.layer).second);
            ++seen[e];
          }
        const size_t part = plan.part[u];
        size_t largest = 0;
        ASSERT_EQ(c.pieces.size(), size_t(n));
        for (size_t r = 0; r < c.pieces.size(); ++r) {
          size_t count = 0, last = 0;
          for (const CodesUnit::Piece& p : c.pieces[r]) {
            EXPECT_GE(p.at, std::max(last, r * part)) << "rank " << r << "'s pieces in its part, in order";
            EXPECT_LE(p.at + p.n, (r + 1) * part);
            for (size_t e = p.at; e < p.at + p.n; ++e) ++seen[e];
            count += p.n;
            last = p.at + p.n;
          }
          largest = std::max(largest, count);
        }
        EXPECT_EQ(c.packed, largest);
        for (size_t e = 0; e < seen.size(); ++e)
          ASSERT_EQ(seen[e], 1) << "unit " << u << " element " << e << ", " << n << " ranks";
      }
    }
}
