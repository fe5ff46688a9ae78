#include "model/param_layout.hpp"

#include <string>

#include "common/error.hpp"
#include "config/config.hpp"

namespace tessera {

ModelShape make_model_shape(int n_layer, int n_head, int n_embd, int block_size, int vocab_size,
                            int vocab_multiple) {
  ModelShape s;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_head;
  s.n_embd = n_embd;
  s.ffn_hidden = 4 * n_embd;
  s.block_size = block_size;
  s.vocab_size = vocab_size;
  s.padded_vocab = (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  return s;
}

ModelShape make_model_shape(const ModelConfig& m, int vocab) {
  ModelShape s = make_model_shape(m.n_layer, m.n_head, m.n_embd, m.block_size, vocab,
                                  m.vocab_multiple);
  s.arch = m.arch;
  s.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  if (m.ffn_hidden > 0) {
    s.ffn_hidden = m.ffn_hidden;
  } else if (s.arch == Arch::Llama) {
    // LLaMA's rule: two thirds of 4C (SwiGLU has three matrices where GELU's MLP has two),
    // rounded up to a multiple of ffn_multiple.
    const long f = (8L * m.n_embd + 2) / 3;
    s.ffn_hidden = int((f + m.ffn_multiple - 1) / m.ffn_multiple * m.ffn_multiple);
  }
  s.tied = m.tie_embeddings == Tie::Auto ? s.arch == Arch::Gpt2 : m.tie_embeddings == Tie::True;
  s.norm_eps = m.norm_eps;
  s.rope_theta = m.rope_theta;
  return s;
}

const char* arch_name(Arch arch) { return arch == Arch::Llama ? "llama" : "gpt2"; }

const std::vector<LayerTensor>& layer_tensors(Arch arch) {
  static const std::vector<LayerTensor> gpt2 = {kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW,
                                                kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW,
                                                kFcProjB};
  static const std::vector<LayerTensor> llama = {kInNormW, kQW, kKW, kVW, kOW, kPostNormW,
                                                 kGateW, kUpW, kDownW};
  return arch == Arch::Llama ? llama : gpt2;
}

ParamLayout make_param_layout(const ModelShape& s) {
  ParamLayout layout;
  layout.shape = s;
  const size_t C = size_t(s.n_embd), F = size_t(s.ffn_hidden), Vp = size_t(s.padded_vocab);
  const size_t hs = size_t(s.head_size()), Q = hs * s.n_head, KV = hs * s.n_kv_head;
  auto add = [&](std::string name, std::vector<size_t> shape, Init init) {
    ParamTensor t;
    t.name = std::move(name);
    t.numel = 1;
    for (size_t d : shape) t.numel *= d;
    t.shape = std::move(shape);
    t.offset = layout.total;
    t.init = init;
    t.weight_decay = t.shape.size() == 2;
    layout.total += t.numel;
    layout.tensors.push_back(std::move(t));
    return int(layout.tensors.size()) - 1;
  };
  // Each layer's tensors, by kind: name, shape, initialisation.
  struct Spec {
    const char* name;
    std::vector<size_t> shape;
    Init init;
  };
  Spec spec[kLayerTensorKinds] = {
      {"ln_1.weight", {C}, Init::Ones},          {"ln_1.bias", {C}, Init::Zeros},
      {"attn.c_attn.weight", {3 * C, C}, Init::Normal}, {"attn.c_attn.bias", {3 * C}, Init::Zeros},
      {"attn.c_proj.weight", {C, C}, Init::ResidualNormal}, {"attn.c_proj.bias", {C}, Init::Zeros},
      {"ln_2.weight", {C}, Init::Ones},          {"ln_2.bias", {C}, Init::Zeros},
      {"mlp.c_fc.weight", {F, C}, Init::Normal}, {"mlp.c_fc.bias", {F}, Init::Zeros},
      {"mlp.c_proj.weight", {C, F}, Init::ResidualNormal}, {"mlp.c_proj.bias", {C}, Init::Zeros},
      // LLaMA (Hugging Face's initialisation: every linear weight normal, no residual scaling).
      {"input_layernorm.weight", {C}, Init::Ones},
      {"self_attn.q_proj.weight", {Q, C}, Init::Normal},
      {"self_attn.k_proj.weight", {KV, C}, Init::Normal},
      {"self_attn.v_proj.weight", {KV, C}, Init::Normal},
      {"self_attn.o_proj.weight", {C, Q}, Init::Normal},
      {"post_attention_layernorm.weight", {C}, Init::Ones},
      {"mlp.gate_proj.weight", {F, C}, Init::Normal},
      {"mlp.up_proj.weight", {F, C}, Init::Normal},
      {"mlp.down_proj.weight", {C, F}, Init::Normal},
  };
  const bool llama = s.arch == Arch::Llama;
  const std::vector<LayerTensor>& kinds = layer_tensors(s.arch);
  for (int& p : layout.kind_position_) p = -1;
  for (size_t k = 0; k < kinds.size(); ++k) layout.kind_position_[kinds[k]] = int(k);
  layout.per_layer_ = int(kinds.size());

  layout.embed = add(llama ? "embed_tokens.weight" : "wte", {Vp, C}, Init::Normal);
  layout.tensors[size_t(layout.embed)].vocab_rows = true;
  if (!llama) layout.positions = add("wpe", {size_t(s.block_size), C}, Init::Normal);
  layout.first_layer_ = int(layout.tensors.size());
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string prefix = (llama ? "layers." : "h.") + std::to_string(l) + ".";
    for (LayerTensor k : kinds) add(prefix + spec[k].name, spec[k].shape, spec[k].init);
  }
  layout.norm_weight = add(llama ? "norm.weight" : "ln_f.weight", {C}, Init::Ones);
  if (!llama) layout.norm_bias = add("ln_f.bias", {C}, Init::Zeros);
  if (!s.tied) {
    layout.head = add("lm_head.weight", {Vp, C}, Init::Normal);
    layout.tensors[size_t(layout.head)].vocab_rows = true;
  }
  return layout;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const ParamTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

double flops_per_token(const ModelShape& s, int seq_len) {
  const double C = s.n_embd, L = s.n_layer, F = s.ffn_hidden;
  const double kv = double(s.head_size()) * s.n_kv_head;
  // Per layer: q and o (C² each), k and v (C·kv each), the MLP (2 or 3 matrices of C·F).
  const double mlp = s.arch == Arch::Llama ? 3.0 * C * F : 2.0 * C * F;
  const double matmul_params = L * (2.0 * C * C + 2.0 * C * kv + mlp) + double(s.padded_vocab) * C;
  return 6.0 * matmul_params + 12.0 * L * C * seq_len;
}

}  // namespace tessera
