#include "model/family.hpp"

#include <stdexcept>

#include "model/mlp.hpp"
#include "model/param_layout.hpp"

namespace tessera {

namespace {

// GPT-2 (Radford et al. 2019): GPT-2's own initialisation scales the residual projections by
// 1/sqrt(2 L).
const Family kGpt2 = {
    Arch::Gpt2, "gpt2",
    /*embed*/ "wte", /*position_table*/ "wpe", /*layers*/ "h.", /*final_norm*/ "ln_f",
    /*head*/ "lm_head.weight", /*tied*/ true, /*tokenizer*/ "GPT-2", /*vocab*/ 50257,
    NormKind::LayerNorm, /*norm1*/ "ln_1", /*norm2*/ "ln_2",
    QkvLayout::Fused, Positions::Learned, /*attention*/ "attn",
    MlpKind::Gelu, /*bias*/ true, /*out_init*/ Init::ResidualNormal,
};

// LLaMA (Touvron et al. 2023) as Hugging Face's LlamaModel names it (plus lm_head), so a
// checkpoint's /model loads into PyTorch by name; its initialisation: every linear weight normal.
const Family kLlama = {
    Arch::Llama, "llama",
    /*embed*/ "embed_tokens.weight", /*position_table*/ nullptr, /*layers*/ "layers.",
    /*final_norm*/ "norm", /*head*/ "lm_head.weight", /*tied*/ false,
    /*tokenizer*/ "LLaMA 3", /*vocab*/ 128256,
    NormKind::RmsNorm, /*norm1*/ "input_layernorm", /*norm2*/ "post_attention_layernorm",
    QkvLayout::Apart, Positions::Rotary, /*attention*/ "self_attn",
    MlpKind::SwiGlu, /*bias*/ false, /*out_init*/ Init::Normal,
};

const Family* const kFamilies[] = {&kGpt2, &kLlama};

// The attention's projections: q, k and v (fused: one [3C, C] tensor whose rows are q, k, v,
// each heads-major; apart: one tensor each, k and v of the key/value heads), column-parallel by
// heads; then their biases; the output projection, row-parallel, and its bias, replicated.
void attention_params(const Family& f, size_t C, size_t Q, size_t KV,
                      std::vector<LayerParam>* out) {
  const std::string at = std::string(f.attention) + ".";
  struct Part {
    std::string name;
    size_t rows;
    Split split;
  };
  std::vector<Part> qkv;
  std::string proj;
  switch (f.qkv) {
    case QkvLayout::Fused:
      if (Q + 2 * KV != 3 * C) throw std::logic_error("a fused c_attn needs n_kv_head = n_head");
      qkv = {{at + "c_attn", 3 * C, Split::QkvRows}}, proj = at + "c_proj";
      break;
    case QkvLayout::Apart:
      qkv = {{at + "q_proj", Q, Split::Rows}, {at + "k_proj", KV, Split::Rows},
             {at + "v_proj", KV, Split::Rows}};
      proj = at + "o_proj";
      break;
  }
  for (const Part& p : qkv)
    out->push_back({kQkvW, p.name + ".weight", {p.rows, C}, Init::Normal, p.split});
  if (f.bias)
    for (const Part& p : qkv)
      out->push_back({kQkvB, p.name + ".bias", {p.rows}, Init::Zeros, p.split});
  out->push_back({kProjW, proj + ".weight", {C, Q}, f.out_init, Split::Columns});
  if (f.bias) out->push_back({kProjB, proj + ".bias", {C}, Init::Zeros, Split::Replicated});
}

}  // namespace

const Family& family(Arch arch) {
  for (const Family* f : kFamilies)
    if (f->arch == arch) return *f;
  throw std::logic_error("model family " + std::to_string(int(arch)) + " has no description");
}

const Family* family_named(const std::string& name) {
  for (const Family* f : kFamilies)
    if (name == f->name) return f;
  return nullptr;
}

std::string family_names() {
  std::string out;
  for (const Family* f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f->name);
  return out;
}

bool expert_role(LayerRole role) {
  return role == kExpertFc1W || role == kExpertFc1B || role == kExpertFc2W || role == kExpertFc2B;
}

void norm_params(const Family& f, const std::string& name, size_t C, std::vector<LayerParam>* out,
                 LayerRole weight, LayerRole bias) {
  out->push_back({weight, name + ".weight", {C}, Init::Ones, Split::Replicated});
  if (f.norm == NormKind::LayerNorm)
    out->push_back({bias, name + ".bias", {C}, Init::Zeros, Split::Replicated});
}

std::vector<LayerParam> layer_params(const ModelShape& s, int l) {
  const Family& f = family(s.arch);
  const size_t C = size_t(s.n_embd), F = size_t(s.ffn_hidden);
  const size_t hs = size_t(s.head_size()), Q = hs * s.n_head, KV = hs * s.n_kv_head;
  std::vector<LayerParam> out;
  norm_params(f, f.norm1, C, &out, kNorm1W, kNorm1B);
  attention_params(f, C, Q, KV, &out);
  // Qwen3's q_norm and k_norm (Qwen3MoeAttention): one RMSNorm weight of head size each, shared
  // by all the heads of q (of k).
  if (s.qk_norm) {
    if (f.norm != NormKind::RmsNorm) throw std::logic_error("model.qk_norm needs RMSNorm");
    const std::string at = std::string(f.attention) + ".";
    out.push_back({kQkNormW, at + "q_norm.weight", {hs}, Init::Ones, Split::Replicated});
    out.push_back({kQkNormW, at + "k_norm.weight", {hs}, Init::Ones, Split::Replicated});
  }
  norm_params(f, f.norm2, C, &out, kNorm2W, kNorm2B);
  if (s.moe.layer(l)) {
    // The shared experts are one dense MLP under their own names (DeepSeek's
    // mlp.shared_experts.*): the dense roles, so they shard, reduce and count as dense weights.
    // Before the router and experts: expert parallelism cuts the layer's last tensors, the
    // experts', into a unit of their own (model/shard.cpp).
    if (s.moe.shared > 0)
      mlp_params(f.mlp, f.bias, f.out_init, C, size_t(s.moe.shared) * size_t(s.moe.ffn), &out,
                 "mlp.shared_experts.");
    moe_params(f.mlp, f.bias, f.out_init, C, size_t(s.moe.ffn), size_t(s.moe.experts), &out);
  } else
    mlp_params(f.mlp, f.bias, f.out_init, C, F, &out);
  return out;
}

BlockWidths block_widths(const ModelShape& s, int tp) {
  BlockWidths w;
  w.hs = s.head_size();
  w.nh = s.n_head / tp;
  w.nkv = s.n_kv_head / tp;
  w.q = w.nh * w.hs;
  w.qkv = (w.nh + 2 * w.nkv) * w.hs;
  w.f = s.ffn_hidden / tp;
  w.fc1 = mlp_fc1_columns(family(s.arch).mlp, w.f);
  w.ef = s.moe.experts > 0 ? s.moe.ffn / tp : 0;
  w.efc1 = mlp_fc1_columns(family(s.arch).mlp, w.ef);
  w.sf = s.moe.experts > 0 ? s.moe.shared * s.moe.ffn / tp : 0;
  w.sfc1 = mlp_fc1_columns(family(s.arch).mlp, w.sf);
  return w;
}

}  // namespace tessera
