// The model-family seam (model/family.hpp): each family's parameter table keeps the names,
// shapes, initialisation and tp splits checkpoints and Hugging Face interop rely on; the GEMMs
// the family's cost lists (model/cost.hpp) are the products of the weights a tile holds; and the
// planner's step time prices exactly those GEMMs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.hpp"
#include "engine/run_layout.hpp"
#include "model/cost.hpp"
#include "model/param_layout.hpp"
#include "model/shard.hpp"
#include "plan/step_time.hpp"

using namespace tessera;

namespace {

using Shape = std::vector<size_t>;

struct Want {
  LayerRole role;
  std::string name;
  Shape shape;
  Init init;
  Split split;
};

void expect_table(const ModelShape& s, const std::vector<Want>& want, int layer = 0) {
  const std::vector<LayerParam> got = layer_params(s, layer);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].role, want[i].role) << want[i].name;
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].shape, want[i].shape) << want[i].name;
    EXPECT_EQ(got[i].init, want[i].init) << want[i].name;
    EXPECT_EQ(got[i].split, want[i].split) << want[i].name;
  }
}

// LLaMA with grouped-query attention: 4 heads of 16 on 2 key/value heads, ffn 176, untied.
ModelShape llama_shape() {
  ModelShape s = make_model_shape(3, 4, 64, 32, 100, 64);
  s.arch = Arch::Llama;
  s.n_kv_head = 2;
  s.ffn_hidden = 176;
  s.tied = false;
  return s;
}

std::vector<std::string> names(const ParamLayout& p) {
  std::vector<std::string> out;
  for (const ParamTensor& t : p.tensors) out.push_back(t.name);
  return out;
}

}  // namespace

TEST(Family, Gpt2TableIsGpt2sStateDict) {
  const ModelShape s = make_model_shape(2, 4, 64, 32, 100, 64);
  const size_t C = 64, F = 256;
  expect_table(s, {
      {kNorm1W, "ln_1.weight", {C}, Init::Ones, Split::Replicated},
      {kNorm1B, "ln_1.bias", {C}, Init::Zeros, Split::Replicated},
      {kQkvW, "attn.c_attn.weight", {3 * C, C}, Init::Normal, Split::QkvRows},
      {kQkvB, "attn.c_attn.bias", {3 * C}, Init::Zeros, Split::QkvRows},
      {kProjW, "attn.c_proj.weight", {C, C}, Init::ResidualNormal, Split::Columns},
      {kProjB, "attn.c_proj.bias", {C}, Init::Zeros, Split::Replicated},
      {kNorm2W, "ln_2.weight", {C}, Init::Ones, Split::Replicated},
      {kNorm2B, "ln_2.bias", {C}, Init::Zeros, Split::Replicated},
      {kFc1W, "mlp.c_fc.weight", {F, C}, Init::Normal, Split::Rows},
      {kFc1B, "mlp.c_fc.bias", {F}, Init::Zeros, Split::Rows},
      {kFc2W, "mlp.c_proj.weight", {C, F}, Init::ResidualNormal, Split::Columns},
      {kFc2B, "mlp.c_proj.bias", {C}, Init::Zeros, Split::Replicated},
  });
  const ParamLayout p = make_param_layout(s);
  const std::vector<std::string> n = names(p);
  EXPECT_EQ(n.front(), "wte");
  EXPECT_EQ(n[1], "wpe");
  EXPECT_EQ(n[2], "h.0.ln_1.weight");
  EXPECT_EQ(n[2 + 12], "h.1.ln_1.weight");
  EXPECT_EQ(std::vector<std::string>(n.end() - 2, n.end()),
            (std::vector<std::string>{"ln_f.weight", "ln_f.bias"}));  // tied: no lm_head
  EXPECT_EQ(p.tensors[size_t(p.positions)].shape, (Shape{32, C}));
  EXPECT_EQ(p.tensors[size_t(p.embed)].split, Split::Rows);
  EXPECT_TRUE(p.tensors[size_t(p.embed)].vocab_rows);
  EXPECT_EQ(p.head, -1);
  EXPECT_EQ(p.tensors[size_t(p.layer(1, kFc2B))].name, "h.1.mlp.c_proj.bias");
  EXPECT_EQ(p.tensors[size_t(p.layer(1, kFc2B))].role, kFc2B);
}

// llama_shape()'s layer table, with model.qk_norm's q_norm and k_norm [hs = 16] after o_proj.
static std::vector<Want> llama_table(bool qk_norm) {
  const size_t C = 64, F = 176, KV = 32, hs = 16;
  std::vector<Want> t = {
      {kNorm1W, "input_layernorm.weight", {C}, Init::Ones, Split::Replicated},
      {kQkvW, "self_attn.q_proj.weight", {C, C}, Init::Normal, Split::Rows},
      {kQkvW, "self_attn.k_proj.weight", {KV, C}, Init::Normal, Split::Rows},
      {kQkvW, "self_attn.v_proj.weight", {KV, C}, Init::Normal, Split::Rows},
      {kProjW, "self_attn.o_proj.weight", {C, C}, Init::Normal, Split::Columns},
      {kNorm2W, "post_attention_layernorm.weight", {C}, Init::Ones, Split::Replicated},
      {kFc1W, "mlp.gate_proj.weight", {F, C}, Init::Normal, Split::Rows},
      {kFc1W, "mlp.up_proj.weight", {F, C}, Init::Normal, Split::Rows},
      {kFc2W, "mlp.down_proj.weight", {C, F}, Init::Normal, Split::Columns},
  };
  if (qk_norm)
    t.insert(t.begin() + 5,
             {{kQkNormW, "self_attn.q_norm.weight", {hs}, Init::Ones, Split::Replicated},
              {kQkNormW, "self_attn.k_norm.weight", {hs}, Init::Ones, Split::Replicated}});
  return t;
}

TEST(Family, LlamaTableIsHuggingFacesLlamaModel) {
  const ModelShape s = llama_shape();
  expect_table(s, llama_table(false));
  const ParamLayout p = make_param_layout(s);
  const std::vector<std::string> n = names(p);
  EXPECT_EQ(n.front(), "embed_tokens.weight");
  EXPECT_EQ(n[1], "layers.0.input_layernorm.weight");
  EXPECT_EQ(std::vector<std::string>(n.end() - 2, n.end()),
            (std::vector<std::string>{"norm.weight", "lm_head.weight"}));
  EXPECT_EQ(p.positions, -1);
  EXPECT_EQ(p.norm_bias, -1);
  EXPECT_TRUE(p.tensors[size_t(p.head)].vocab_rows);
  // A role names its first tensor; the others of the role follow it.
  EXPECT_EQ(p.tensors[size_t(p.layer(2, kQkvW))].name, "layers.2.self_attn.q_proj.weight");
  EXPECT_EQ(p.tensors[size_t(p.layer(2, kQkvW) + 2)].name, "layers.2.self_attn.v_proj.weight");
  EXPECT_EQ(p.tensors[size_t(p.layer(2, kFc1W) + 1)].name, "layers.2.mlp.up_proj.weight");
  for (LayerRole r : {kNorm1B, kQkvB, kProjB, kNorm2B, kFc1B, kFc2B}) EXPECT_FALSE(p.has(2, r));
}

// model.qk_norm: Qwen3's q_norm and k_norm after the attention's projections, one weight of head
// size each (ones), replicated over tp, adjacent under one role; under tp each rank's gradient of
// them is partial (its heads) and summed over tp.
TEST(Family, QkNormAddsQwen3sPerHeadNorms) {
  ModelShape s = llama_shape();
  s.qk_norm = true;
  const size_t hs = 16;
  expect_table(s, llama_table(true));
  const ParamLayout p = make_param_layout(s);
  EXPECT_EQ(p.tensors[size_t(p.layer(1, kQkNormW))].name, "layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(p.tensors[size_t(p.layer(1, kQkNormW) + 1)].name, "layers.1.self_attn.k_norm.weight");
  EXPECT_FALSE(p.tensors[size_t(p.layer(1, kQkNormW))].weight_decay);
  EXPECT_FALSE(make_param_layout(llama_shape()).has(1, kQkNormW));
  // Every tp rank holds both whole; tp rank 0 owns them.
  const LocalLayout t1 = make_local_layout(s, 2, 1, 0, 3, true, true);
  const LocalTensor& q = t1.tensors[size_t(t1.layer(2, kQkNormW))];
  EXPECT_EQ(q.numel, hs);
  EXPECT_FALSE(q.owner);
  EXPECT_EQ(t1.tensors[size_t(t1.layer(2, kQkNormW) + 1)].offset, q.offset + hs);
  // The cost's streaming: one more pass over the q and k heads.
  ModelShape plain = llama_shape();
  EXPECT_EQ(block_cost(s, 2).gemm_out_elems - block_cost(plain, 2).gemm_out_elems,
            3.0 * (2 + 1) * hs);
  EXPECT_EQ(block_cost(s, 1).forward_kernels, block_cost(plain, 1).forward_kernels + 1);
}

// A mixture of experts (model.moe): the layers it names hold a router and the experts' stacked
// tensors in place of the dense MLP; the others keep it. Each layer's roles find its tensors.
TEST(Family, MoeLayersReplaceTheDenseMlpWhereTheDeckSays) {
  ModelShape s = make_model_shape(4, 4, 64, 32, 100, 64);
  s.moe.experts = 4, s.moe.top_k = 2, s.moe.ffn = 32, s.moe.every = 2, s.moe.first_dense = 0;
  const size_t C = 64, E = 4, F = 32;
  EXPECT_FALSE(s.moe.layer(0));
  EXPECT_TRUE(s.moe.layer(1));
  EXPECT_TRUE(s.moe.layer(3));
  expect_table(s, {
      {kNorm1W, "ln_1.weight", {C}, Init::Ones, Split::Replicated},
      {kNorm1B, "ln_1.bias", {C}, Init::Zeros, Split::Replicated},
      {kQkvW, "attn.c_attn.weight", {3 * C, C}, Init::Normal, Split::QkvRows},
      {kQkvB, "attn.c_attn.bias", {3 * C}, Init::Zeros, Split::QkvRows},
      {kProjW, "attn.c_proj.weight", {C, C}, Init::ResidualNormal, Split::Columns},
      {kProjB, "attn.c_proj.bias", {C}, Init::Zeros, Split::Replicated},
      {kNorm2W, "ln_2.weight", {C}, Init::Ones, Split::Replicated},
      {kNorm2B, "ln_2.bias", {C}, Init::Zeros, Split::Replicated},
      {kRouterW, "mlp.router.weight", {E, C}, Init::Normal, Split::Replicated},
      {kExpertFc1W, "mlp.experts.c_fc.weight", {E * F, C}, Init::Normal, Split::PartRows},
      {kExpertFc1B, "mlp.experts.c_fc.bias", {E * F}, Init::Zeros, Split::PartRows},
      {kExpertFc2W, "mlp.experts.c_proj.weight", {E * C, F}, Init::ResidualNormal,
       Split::Columns},
      {kExpertFc2B, "mlp.experts.c_proj.bias", {E * C}, Init::Zeros, Split::Replicated},
  }, 1);
  const ParamLayout p = make_param_layout(s);
  EXPECT_EQ(p.layer_tensors(0), 12);
  EXPECT_EQ(p.layer_tensors(1), 13);
  EXPECT_TRUE(p.has(0, kFc1W));
  EXPECT_FALSE(p.has(1, kFc1W));
  EXPECT_TRUE(p.has(1, kRouterW));
  EXPECT_EQ(p.tensors[size_t(p.layer(2, kFc2B))].name, "h.2.mlp.c_proj.bias");
  EXPECT_EQ(p.tensors[size_t(p.layer(3, kExpertFc2W))].name, "h.3.mlp.experts.c_proj.weight");
  EXPECT_EQ(p.tensors[size_t(p.layer_begin(3))].name, "h.3.ln_1.weight");
  // Weight decay by dimension: the router and experts' weights, not their 1-D biases.
  EXPECT_TRUE(p.tensors[size_t(p.layer(1, kRouterW))].weight_decay);
  EXPECT_FALSE(p.tensors[size_t(p.layer(1, kExpertFc1B))].weight_decay);

  // tp = 2: rank 1 holds the second half of each expert's fc1 rows (and bias), the second half
  // of fc2's columns, the whole router; each layer one unit of its own tensors.
  const LocalLayout t = make_local_layout(s, 2, 1, 0, 4, true, true);
  const LocalTensor& fc1 = t.tensors[size_t(t.layer(1, kExpertFc1W))];
  ASSERT_EQ(fc1.blocks.size(), E);
  for (size_t e = 0; e < E; ++e) {
    EXPECT_EQ(fc1.blocks[e].row0, e * F + F / 2);
    EXPECT_EQ(fc1.blocks[e].rows, F / 2);
    EXPECT_EQ(fc1.blocks[e].cols, C);
  }
  EXPECT_EQ(fc1.shape, (Shape{E * F / 2, C}));
  EXPECT_EQ(t.tensors[size_t(t.layer(1, kExpertFc1B))].shape, (Shape{E * F / 2}));
  EXPECT_EQ(t.tensors[size_t(t.layer(1, kExpertFc2W))].shape, (Shape{E * C, F / 2}));
  EXPECT_EQ(t.tensors[size_t(t.layer(1, kRouterW))].shape, (Shape{E, C}));
  EXPECT_FALSE(t.tensors[size_t(t.layer(1, kRouterW))].owner);  // tp rank 0 owns replicas
  const auto [b1, e1] = t.layer_range(1);
  EXPECT_EQ(t.units[size_t(t.layer_unit(1))].begin, b1);
  EXPECT_EQ(t.units[size_t(t.layer_unit(1))].end, e1);

  // LLaMA's experts: each expert's gate rows then its up rows, split over tp in each.
  ModelShape l = llama_shape();
  l.moe = s.moe;
  l.moe.every = 1;
  const LocalLayout lt = make_local_layout(l, 2, 0, 0, 3, true, true);
  const LocalTensor& gu = lt.tensors[size_t(lt.layer(0, kExpertFc1W))];
  EXPECT_EQ(lt.canon(gu).name, "layers.0.mlp.experts.gate_up_proj.weight");
  ASSERT_EQ(gu.blocks.size(), 2 * E);
  EXPECT_EQ(gu.blocks[1].row0, F);      // expert 0's up rows
  EXPECT_EQ(gu.blocks[2].row0, 2 * F);  // expert 1's gate rows
  EXPECT_EQ(gu.blocks[1].rows, F / 2);
  EXPECT_FALSE(lt.canonical.has(0, kExpertFc1B));
  const BlockWidths w = block_widths(l, 2);
  EXPECT_EQ(w.ef, int(F) / 2);
  EXPECT_EQ(w.efc1, int(F));
  // FLOPs on active parameters: the router and top_k of the E experts.
  const double dense_mlp = 3.0 * 64 * 176, expert = 3.0 * 64 * F;
  EXPECT_DOUBLE_EQ(active_matmul_params(l),
                   3 * (layer_matmul_params(l) - dense_mlp + 64.0 * E + 2 * expert));
}

TEST(Family, NamesDefaultsAndLookups) {
  EXPECT_EQ(family_named("llama")->arch, Arch::Llama);
  EXPECT_EQ(family_named("gpt2")->arch, Arch::Gpt2);
  EXPECT_EQ(family_named("mixtral"), nullptr);
  EXPECT_EQ(family_names(), "gpt2, llama");
  EXPECT_STREQ(arch_name(Arch::Llama), "llama");
  // The deck's defaults come from the family: LLaMA's SwiGLU width (8 C / 3 rounded up to
  // ffn_multiple) and untied head; GPT-2's 4 C and tied head.
  ModelConfig m;
  m.n_layer = 2, m.n_head = 4, m.n_embd = 64, m.block_size = 32, m.ffn_multiple = 32;
  m.arch = Arch::Llama;
  const ModelShape l = make_model_shape(m, 100);
  EXPECT_EQ(l.ffn_hidden, 192);  // (8 * 64 + 2) / 3 = 171 -> 192
  EXPECT_FALSE(l.tied);
  m.arch = Arch::Gpt2;
  const ModelShape g = make_model_shape(m, 100);
  EXPECT_EQ(g.ffn_hidden, 256);
  EXPECT_TRUE(g.tied);
  m.tie_embeddings = Tie::False;
  EXPECT_FALSE(make_model_shape(m, 100).tied);
}

// The cost's GEMMs are the products of the weights a tile holds: for each, the local shards of
// its weight role stacked by rows are (out, in), on every tp rank and split.
TEST(Cost, GemmsAreTheTilesWeights) {
  for (const ModelShape& s : {make_model_shape(2, 4, 64, 32, 100, 64), llama_shape()}) {
    for (int tp : {1, 2}) {
      const BlockCost cost = block_cost(s, tp);
      ASSERT_EQ(cost.gemms.size(), size_t(Fp8State::kGemms));
      for (int r = 0; r < tp; ++r) {
        const LocalLayout tile = make_local_layout(s, tp, r, 0, s.n_layer, true, true);
        for (size_t i = 0; i < cost.gemms.size(); ++i) {
          const LinearGemm& g = cost.gemms[i];
          EXPECT_EQ(g.gemm, int(i));
          size_t rows = 0, cols = 0;
          for (int t = tile.layer(1, g.weight);
               t < int(tile.tensors.size()) && tile.canon(tile.tensors[size_t(t)]).role == g.weight;
               ++t) {
            rows += tile.tensors[size_t(t)].shape[0];
            cols = tile.tensors[size_t(t)].shape[1];
          }
          EXPECT_EQ(int(rows), g.out) << arch_name(s.arch) << " tp " << tp << " gemm " << i;
          EXPECT_EQ(int(cols), g.in) << arch_name(s.arch) << " tp " << tp << " gemm " << i;
        }
      }
      const BlockWidths& w = cost.width;
      EXPECT_EQ(w.fc1, s.arch == Arch::Llama ? 2 * w.f : w.f);
      EXPECT_EQ(w.qkv, (w.nh + 2 * w.nkv) * w.hs);
    }
  }
}

TEST(Cost, CountsOfTheDescription) {
  const ModelShape g = make_model_shape(2, 4, 64, 32, 100, 64), l = llama_shape();
  const double C = 64;
  // N_matmul per layer: GPT-2's 12 C^2; LLaMA's q, o (C^2 each), k, v (C kv each), 3 C F.
  EXPECT_EQ(layer_matmul_params(g), 12 * C * C);
  EXPECT_EQ(layer_matmul_params(l), 2 * C * C + 2 * C * 32 + 3 * C * 176);
  EXPECT_EQ(flops_per_token(l, 16), 6 * (3 * layer_matmul_params(l) + 128 * C) + 12 * 3 * C * 16);
  // The norms' parameters sequence parallelism leaves partial: LayerNorm's weight and bias.
  EXPECT_EQ(layer_norm_params(g), 4 * C);
  EXPECT_EQ(final_norm_params(g), 2 * C);
  EXPECT_EQ(layer_norm_params(l), 2 * C);
  EXPECT_EQ(final_norm_params(l), C);
  // Two sections: 4 all-reduces (6 with a rerun); 10 (14) gathers and reduce-scatters.
  const BlockCost cost = block_cost(l, 2);
  EXPECT_EQ(tp_collectives(cost, false, false), 4);
  EXPECT_EQ(tp_collectives(cost, false, true), 6);
  EXPECT_EQ(tp_collectives(cost, true, false), 10);
  EXPECT_EQ(tp_collectives(cost, true, true), 14);
}

// On an ideal device (GEMMs at their FLOPs, streams, launches and links free) one rank's compute
// is the GEMMs of the layers' weights forward and backward (6 n per weight element), the
// attention's products and the head's: the planner prices what the tile holds, nothing else.
TEST(Cost, PlannerPricesTheWeightsGemms) {
  for (Arch arch : {Arch::Gpt2, Arch::Llama}) {
    Config cfg;
    cfg.model.arch = arch;
    cfg.model.n_layer = 3, cfg.model.n_head = 4, cfg.model.n_embd = 64, cfg.model.block_size = 32;
    cfg.data.seq_len = 32;
    cfg.train.batch_size = 4, cfg.train.micro_batch = 2;
    const ModelShape s = make_model_shape(cfg.model, 100);
    RunLayout run;
    ASSERT_EQ(make_run_layout(cfg, s, ParallelLayout{}, &run), "");
    Machine m;
    m.peak_fp32 = 1e12, m.memory_bw = 1e30, m.gemm_efficiency = 1, m.gemm_tile = 0;
    m.kernel_overhead = 0, m.memory = 1e12, m.intra_bw = m.inter_bw = 1e30;
    const StepTime t = step_time(cfg, s, run, m, false, 0);
    const ParamLayout p = make_param_layout(s);
    double weights = 0;  // one layer's 2-D tensors
    for (int i = p.layer_begin(0); i < p.layer_begin(1); ++i)
      if (p.tensors[size_t(i)].shape.size() == 2) weights += double(p.tensors[size_t(i)].numel);
    const double n = 2 * 32, T = 32, hs = 16, C = 64, Vp = 128, peak = 1e12;
    const double attention = 3 * 2 * 4 * (2 * T * T * hs * 2) / peak;  // b nh (QK^T, PV), x3
    const double layer = 6 * n * weights / peak + attention;
    const double want = run.n_micro * (3 * layer + 6 * n * Vp * C / peak);
    EXPECT_NEAR(t.compute, want, 1e-9 * want) << deck_word(arch);
    EXPECT_EQ(t.model_flops, 4 * T * (6 * (3 * layer_matmul_params(s) + Vp * C) + 12 * 3 * C * T));
    // Fused attention computes only the causal tiles: T (T + 1) / 2 of the T^2 scores, with
    // tiles of one element.
    cfg.model.attention = Attention::Fused;
    const StepTime fused = step_time(cfg, s, run, m, false, 0);
    const double causal = run.n_micro * 3 * attention * (T + 1) / (2 * T);
    EXPECT_NEAR(fused.compute, want - run.n_micro * 3 * attention + causal, 1e-9 * want);
  }
}

// The same for MoE layers (model.moe): an MoE layer's GEMMs are its attention's, the router's on
// every row and each of the E experts' on its balanced n k / E rows, i.e. 6 n per active weight
// element (the router and k experts); model FLOPs count the active parameters.
TEST(Cost, PlannerPricesTheMoeLayersActiveGemms) {
  for (Arch arch : {Arch::Gpt2, Arch::Llama}) {
    Config cfg;
    cfg.model.arch = arch;
    cfg.model.n_layer = 3, cfg.model.n_head = 4, cfg.model.n_embd = 64, cfg.model.block_size = 32;
    cfg.model.moe.experts = 4, cfg.model.moe.top_k = 2, cfg.model.moe.ffn = 32;
    cfg.model.moe.every = 2;  // layer 1
    cfg.data.seq_len = 32;
    cfg.train.batch_size = 4, cfg.train.micro_batch = 2;
    const ModelShape s = make_model_shape(cfg.model, 100);
    ASSERT_TRUE(s.moe.layer(1) && !s.moe.layer(0) && !s.moe.layer(2));
    EXPECT_EQ(moe_layers(s, 0, 3), 1);
    RunLayout run;
    ASSERT_EQ(make_run_layout(cfg, s, ParallelLayout{}, &run), "");
    Machine m;
    m.peak_fp32 = 1e12, m.memory_bw = 1e30, m.gemm_efficiency = 1, m.gemm_tile = 0;
    m.kernel_overhead = 0, m.memory = 1e12, m.intra_bw = m.inter_bw = 1e30;
    const StepTime t = step_time(cfg, s, run, m, false, 0);
    const ParamLayout p = make_param_layout(s);
    auto weights = [&](int l, bool active) {  // layer l's 2-D tensors, experts' by k / E
      double w = 0;
      for (int i = p.layer_begin(l); i < p.layer_begin(l) + p.layer_tensors(l); ++i) {
        const ParamTensor& x = p.tensors[size_t(i)];
        if (x.shape.size() != 2) continue;
        const bool expert = x.role == kExpertFc1W || x.role == kExpertFc2W;
        w += double(x.numel) * (expert && active ? 2.0 / 4 : 1.0);
      }
      return w;
    };
    const double n = 2 * 32, T = 32, hs = 16, C = 64, Vp = 128, peak = 1e12;
    const double attention = 3 * 2 * 4 * (2 * T * T * hs * 2) / peak;
    const double layers = 6 * n * (weights(0, true) + weights(1, true) + weights(2, true)) / peak;
    const double want = run.n_micro * (layers + 3 * attention + 6 * n * Vp * C / peak);
    EXPECT_NEAR(t.compute, want, 1e-9 * want) << deck_word(arch);
    EXPECT_EQ(t.model_flops, 4 * T * (6 * (active_matmul_params(s) + Vp * C) + 12 * 3 * C * T));
    EXPECT_LT(weights(1, true), weights(1, false));
    // The cost's own description: its router and one expert are the tile's weights.
    const BlockCost moe = block_cost(s, 1, true);
    EXPECT_EQ(moe.gemms.size(), 2u);
    EXPECT_EQ(moe.moe.router.out, 4);
    EXPECT_EQ(moe.moe.router.in, 64);
    EXPECT_EQ(double(moe.moe.expert[0].out) * moe.moe.expert[0].in * 4,
              double(p.tensors[size_t(p.layer(1, kExpertFc1W))].numel));
    EXPECT_EQ(double(moe.moe.expert[1].out) * moe.moe.expert[1].in * 4,
              double(p.tensors[size_t(p.layer(1, kExpertFc2W))].numel));
    const ParamCounts counts = param_counts(s);
    EXPECT_EQ(counts.total, double(p.total));
    EXPECT_DOUBLE_EQ(counts.total - counts.active, counts.expert / 2);
  }
}
