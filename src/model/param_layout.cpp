#include "model/param_layout.hpp"

#include <string>

#include "common/error.hpp"
#include "config/config.hpp"
#include "model/cost.hpp"
#include "model/mlp.hpp"

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
  const Family& f = family(m.arch);
  s.arch = f.arch;
  s.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  s.ffn_hidden =
      m.ffn_hidden > 0 ? m.ffn_hidden : mlp_default_width(f.mlp, m.n_embd, m.ffn_multiple);
  s.tied = m.tie_embeddings == Tie::Auto ? f.tied : m.tie_embeddings == Tie::True;
  s.norm_eps = m.norm_eps;
  s.rope_theta = m.rope_theta;
  s.qk_norm = m.qk_norm;
  if (m.moe.experts > 0) {
    s.moe.experts = m.moe.experts;
    s.moe.top_k = m.moe.top_k;
    s.moe.ffn = m.moe.ffn > 0 ? m.moe.ffn : s.ffn_hidden;
    s.moe.every = m.moe.every;
    s.moe.first_dense = m.moe.first_dense;
    s.moe.shared = m.moe.shared_experts;
  }
  return s;
}

const char* arch_name(Arch arch) { return family(arch).name; }

namespace {

bool same_shape(const ModelShape& a, const ModelShape& b) {
  return a.arch == b.arch && a.n_layer == b.n_layer && a.n_head == b.n_head &&
         a.n_kv_head == b.n_kv_head && a.n_embd == b.n_embd && a.ffn_hidden == b.ffn_hidden &&
         a.block_size == b.block_size && a.vocab_size == b.vocab_size &&
         a.padded_vocab == b.padded_vocab && a.tied == b.tied && a.norm_eps == b.norm_eps &&
         a.rope_theta == b.rope_theta && a.qk_norm == b.qk_norm && a.moe.experts == b.moe.experts &&
         a.moe.top_k == b.moe.top_k && a.moe.ffn == b.moe.ffn && a.moe.every == b.moe.every &&
         a.moe.first_dense == b.moe.first_dense && a.moe.shared == b.moe.shared;
}

ParamLayout build_param_layout(const ModelShape& s);

}  // namespace

// The last shape's table kept: `tessera plan --search` lays out thousands of tiles of one model.
ParamLayout make_param_layout(const ModelShape& s) {
  thread_local ModelShape last;
  thread_local ParamLayout table;
  thread_local bool have = false;
  if (!have || !same_shape(last, s)) {
    table = build_param_layout(s);
    last = s;
    have = true;
  }
  return table;
}

namespace {

ParamLayout build_param_layout(const ModelShape& s) {
  const Family& f = family(s.arch);
  ParamLayout layout;
  layout.shape = s;
  const size_t C = size_t(s.n_embd), Vp = size_t(s.padded_vocab);
  auto add = [&](std::string name, std::vector<size_t> shape, Init init, Split split,
                 int parts = 1) {
    ParamTensor t;
    t.name = std::move(name);
    t.numel = 1;
    for (size_t d : shape) t.numel *= d;
    t.shape = std::move(shape);
    t.offset = layout.total;
    t.init = init;
    t.weight_decay = t.shape.size() == 2;
    t.split = split;
    t.parts = parts;
    layout.total += t.numel;
    layout.tensors.push_back(std::move(t));
    return int(layout.tensors.size()) - 1;
  };
  // Each kind of layer's table (dense: layer -1; an MoE layer's where the model has one), built
  // once: the planner's search lays out thousands of tiles.
  std::vector<LayerParam> tables[2];
  for (int kind = 0; kind < 2; ++kind) {
    int l = -1;
    for (int m = 0; m < s.n_layer && kind == 1 && l < 0; ++m)
      if (s.moe.layer(m)) l = m;
    const std::vector<LayerParam>& block = tables[kind] = layer_params(s, l);
    for (int& p : layout.role_position_[kind]) p = -1;
    for (size_t k = block.size(); k-- > 0;) layout.role_position_[kind][block[k].role] = int(k);
    layout.kind_tensors_[kind] = int(block.size());
  }

  // The vocab-parallel embedding (its padding rows inert), and the learned positions.
  layout.embed = add(f.embed, {Vp, C}, Init::Normal, Split::Rows);
  layout.tensors[size_t(layout.embed)].vocab_rows = true;
  if (f.position == Positions::Learned)
    layout.positions =
        add(f.position_table, {size_t(s.block_size), C}, Init::Normal, Split::Replicated);
  for (int l = 0; l < s.n_layer; ++l) {
    layout.layer_first_.push_back(int(layout.tensors.size()));
    const std::string prefix = f.layers + std::to_string(l) + ".";
    for (const LayerParam& p : tables[layout.kind(l)]) {
      add(prefix + p.name, p.shape, p.init, p.split, p.parts);
      layout.tensors.back().role = p.role;
    }
  }
  std::vector<LayerParam> final_norm;
  norm_params(f, f.final_norm, C, &final_norm);
  layout.norm_weight = add(final_norm[0].name, final_norm[0].shape, final_norm[0].init,
                           final_norm[0].split);
  if (final_norm.size() > 1)
    layout.norm_bias = add(final_norm[1].name, final_norm[1].shape, final_norm[1].init,
                           final_norm[1].split);
  if (!s.tied) {
    layout.head = add(f.head, {Vp, C}, Init::Normal, Split::Rows);  // vocab-parallel
    layout.tensors[size_t(layout.head)].vocab_rows = true;
  }
  return layout;
}

}  // namespace

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const ParamTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

double flops_per_token(const ModelShape& s, int seq_len) {
  const double matmul_params = active_matmul_params(s) + double(s.padded_vocab) * s.n_embd;
  return 6.0 * matmul_params + 12.0 * double(s.n_layer) * s.n_embd * seq_len;
}

}  // namespace tessera
