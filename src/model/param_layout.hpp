#pragma once
// The parameter table: canonical name, shape and offset of every tensor in the one flat parameter
// buffer (DESIGN §4). Gradients, Adam moments and checkpoints use the same offsets.
#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

struct ModelShape {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;       // C
  int block_size = 0;   // rows of wpe
  int vocab_size = 0;   // V: real tokens
  int padded_vocab = 0; // Vp: rows of wte, a multiple of vocab_multiple
};

ModelShape make_model_shape(int n_layer, int n_head, int n_embd, int block_size, int vocab_size,
                            int vocab_multiple);

enum class Init { Normal, ResidualNormal, Zeros, Ones };

struct ParamTensor {
  std::string name;             // torch state_dict key, e.g. "h.3.mlp.c_fc.weight"
  std::vector<size_t> shape;    // [rows, cols] as nn.Linear ([out, in]), or [n]
  size_t offset = 0;            // into the flat buffer, in elements
  size_t numel = 0;
  Init init = Init::Zeros;
  bool weight_decay = false;    // 2-D tensors only: none on biases and norm weights
};

// Per-layer tensors, in buffer order within a layer.
enum LayerTensor {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kLayerTensorCount
};

struct ParamLayout {
  ModelShape shape;
  std::vector<ParamTensor> tensors;  // wte, wpe, h.0.* ... h.{L-1}.*, ln_f.weight, ln_f.bias
  size_t total = 0;

  size_t wte() const { return 0; }
  size_t wpe() const { return 1; }
  size_t layer(int l, LayerTensor t) const { return 2 + size_t(l) * kLayerTensorCount + t; }
  size_t ln_f_weight() const { return 2 + size_t(shape.n_layer) * kLayerTensorCount; }
  size_t ln_f_bias() const { return ln_f_weight() + 1; }
  const ParamTensor* find(const std::string& name) const;
};

ParamLayout make_param_layout(const ModelShape& shape);

// Model FLOPs per trained token (forward + backward), FORMULAS.md convention:
// 6 * (matmul parameters, LM head Vp*C included) + 12 * L * C * T for attention, unmasked.
double flops_per_token(const ModelShape& shape, int seq_len);

}  // namespace tessera
