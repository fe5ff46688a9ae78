#include "model/param_layout.hpp"

#include <string>

#include "common/error.hpp"

namespace tessera {

ModelShape make_model_shape(int n_layer, int n_head, int n_embd, int block_size, int vocab_size,
                            int vocab_multiple) {
  ModelShape s;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_embd = n_embd;
  s.block_size = block_size;
  s.vocab_size = vocab_size;
  s.padded_vocab = (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  return s;
}

ParamLayout make_param_layout(const ModelShape& s) {
  ParamLayout layout;
  layout.shape = s;
  const size_t C = size_t(s.n_embd);
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
  };
  add("wte", {size_t(s.padded_vocab), C}, Init::Normal);
  add("wpe", {size_t(s.block_size), C}, Init::Normal);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, Init::Ones);
    add(h + "ln_1.bias", {C}, Init::Zeros);
    add(h + "attn.c_attn.weight", {3 * C, C}, Init::Normal);
    add(h + "attn.c_attn.bias", {3 * C}, Init::Zeros);
    add(h + "attn.c_proj.weight", {C, C}, Init::ResidualNormal);
    add(h + "attn.c_proj.bias", {C}, Init::Zeros);
    add(h + "ln_2.weight", {C}, Init::Ones);
    add(h + "ln_2.bias", {C}, Init::Zeros);
    add(h + "mlp.c_fc.weight", {4 * C, C}, Init::Normal);
    add(h + "mlp.c_fc.bias", {4 * C}, Init::Zeros);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, Init::ResidualNormal);
    add(h + "mlp.c_proj.bias", {C}, Init::Zeros);
  }
  add("ln_f.weight", {C}, Init::Ones);
  add("ln_f.bias", {C}, Init::Zeros);
  return layout;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const ParamTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

double flops_per_token(const ModelShape& s, int seq_len) {
  const double C = s.n_embd, L = s.n_layer;
  const double matmul_params = L * 12.0 * C * C + double(s.padded_vocab) * C;
  return 6.0 * matmul_params + 12.0 * L * C * seq_len;
}

}  // namespace tessera
