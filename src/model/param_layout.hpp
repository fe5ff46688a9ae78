#pragma once
// The parameter table: canonical name, shape and offset of every tensor in the one flat parameter
// buffer (docs/models.md). Gradients, Adam moments and checkpoints use the same offsets.
//
// Two block families (model.arch). GPT-2: learned positions, pre-LayerNorm with biases, GELU MLP,
// fused c_attn, GPT-2's state_dict names. LLaMA: no positions in the embedding (rotary ones on q
// and k), RMSNorm, SwiGLU MLP, grouped-query attention with separate q, k, v projections, no
// biases, the names of Hugging Face's LlamaModel (plus lm_head), so a checkpoint's /model loads
// into a PyTorch LLaMA by name. Either ties the LM head to the token embedding or not.
#include <cstddef>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace tessera {

// Arch (config/config.hpp): model.arch, the block family.

struct ModelShape {
  Arch arch = Arch::Gpt2;
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;    // key/value heads (GPT-2: n_head)
  int n_embd = 0;       // C
  int ffn_hidden = 0;   // MLP width (GPT-2: 4C)
  int block_size = 0;   // the longest sequence (rows of wpe for GPT-2)
  int vocab_size = 0;   // V: real tokens
  int padded_vocab = 0; // Vp: rows of the embedding and head, a multiple of vocab_multiple
  bool tied = true;     // the LM head is the token embedding
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int head_size() const { return n_embd / n_head; }
};

// GPT-2 of that shape, tied (the tests' and the GPU bench's models).
ModelShape make_model_shape(int n_layer, int n_head, int n_embd, int block_size, int vocab_size,
                            int vocab_multiple);
// The deck's model (its `vocab_size` 0 replaced by `vocab`), defaults resolved: n_kv_head,
// ffn_hidden (LLaMA: 8C/3 rounded up to ffn_multiple), tie_embeddings.
ModelShape make_model_shape(const ModelConfig& model, int vocab);
const char* arch_name(Arch arch);

enum class Init { Normal, ResidualNormal, Zeros, Ones };

struct ParamTensor {
  std::string name;             // torch state_dict key, e.g. "h.3.mlp.c_fc.weight"
  std::vector<size_t> shape;    // [rows, cols] as nn.Linear ([out, in]), or [n]
  size_t offset = 0;            // into the flat buffer, in elements
  size_t numel = 0;
  Init init = Init::Zeros;
  bool weight_decay = false;    // 2-D tensors only: none on biases and norm weights
  bool vocab_rows = false;      // rows are the (padded) vocabulary: the embedding and the head
};

// Per-layer tensors of both families. A layer holds its family's kinds in this order, so the
// local shards of q, k and v (and of gate and up) sit next to each other: one GEMM computes them.
enum LayerTensor {
  // GPT-2
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
  // LLaMA
  kInNormW, kQW, kKW, kVW, kOW, kPostNormW, kGateW, kUpW, kDownW,
  kLayerTensorKinds
};
// The kinds of a family's layer, in buffer order.
const std::vector<LayerTensor>& layer_tensors(Arch arch);

struct ParamLayout {
  ModelShape shape;
  // GPT-2: wte, wpe, h.0.* ... h.{L-1}.*, ln_f.weight, ln_f.bias[, lm_head.weight]
  // LLaMA: embed_tokens.weight, layers.0.* ... layers.{L-1}.*, norm.weight[, lm_head.weight]
  std::vector<ParamTensor> tensors;
  size_t total = 0;

  // Tensor indices; -1 where the family has none (wpe, the final norm's bias in LLaMA; the head
  // when tied).
  int embed = -1, positions = -1, norm_weight = -1, norm_bias = -1, head = -1;
  int layer(int l, LayerTensor t) const {
    return first_layer_ + l * per_layer_ + kind_position_[t];
  }
  bool has(LayerTensor t) const { return kind_position_[t] >= 0; }
  int per_layer() const { return per_layer_; }
  const ParamTensor* find(const std::string& name) const;

  int first_layer_ = 0, per_layer_ = 0;
  int kind_position_[kLayerTensorKinds] = {};
};

ParamLayout make_param_layout(const ModelShape& shape);

// Model FLOPs per trained token (forward + backward), FORMULAS.md convention:
// 6 * (matmul parameters, LM head Vp*C included) + 12 * L * C * T for attention, unmasked.
double flops_per_token(const ModelShape& shape, int seq_len);

}  // namespace tessera
