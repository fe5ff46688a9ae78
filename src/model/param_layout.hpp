#pragma once
// The parameter table: canonical name, shape and offset of every tensor in the one flat parameter
// buffer (docs/models.md). Gradients, Adam moments and checkpoints use the same offsets.
//
// The model family (model.arch, model/family.hpp) describes the tensors: the embedding (and
// learned positions), each layer's table (layer_params), the final norm, and an LM head of its
// own unless it is tied to the token embedding.
#include <cstddef>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/family.hpp"

namespace tessera {

// The mixture of experts' shape (model.moe): which layers route their tokens through experts
// instead of the dense MLP, how many experts and of what width. experts = 0: a dense model.
struct MoeShape {
  int experts = 0;      // E routed experts of each MoE layer
  int top_k = 1;        // the experts each token goes to
  int ffn = 0;          // each expert's MLP width (resolved: never 0 with experts)
  int every = 1;        // layer l is MoE when l >= first_dense and (l + 1) % every == 0
  int first_dense = 0;
  int shared = 0;       // shared experts: one always-on MLP of width shared x ffn per MoE layer
  bool layer(int l) const { return experts > 0 && l >= first_dense && (l + 1) % every == 0; }
};

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
  bool qk_norm = false;  // llama: each q and k head RMS-normalised before the rotary embedding
  MoeShape moe;
  int head_size() const { return n_embd / n_head; }
};

// GPT-2 of that shape, tied (the tests' and the GPU bench's models).
ModelShape make_model_shape(int n_layer, int n_head, int n_embd, int block_size, int vocab_size,
                            int vocab_multiple);
// The deck's model (its `vocab_size` 0 replaced by `vocab`), defaults resolved: n_kv_head,
// ffn_hidden (the family's MLP's default, model/mlp.hpp), tie_embeddings (the family's).
ModelShape make_model_shape(const ModelConfig& model, int vocab);
const char* arch_name(Arch arch);

struct ParamTensor {
  std::string name;             // torch state_dict key, e.g. "h.3.mlp.c_fc.weight"
  std::vector<size_t> shape;    // [rows, cols] as nn.Linear ([out, in]), or [n]
  size_t offset = 0;            // into the flat buffer, in elements
  size_t numel = 0;
  Init init = Init::Zeros;
  bool weight_decay = false;    // 2-D tensors only: none on biases and norm weights
  bool vocab_rows = false;      // rows are the (padded) vocabulary: the embedding and the head
  Split split = Split::Replicated;  // how tensor parallelism shards it (model/shard.cpp)
  int parts = 1;                    // Split::PartRows' row blocks
  LayerRole role = kLayerRoles;     // what it is in its layer; kLayerRoles outside the layers
};

struct ParamLayout {
  ModelShape shape;
  // GPT-2: wte, wpe, h.0.* ... h.{L-1}.*, ln_f.weight, ln_f.bias[, lm_head.weight]
  // LLaMA: embed_tokens.weight, layers.0.* ... layers.{L-1}.*, norm.weight[, lm_head.weight]
  std::vector<ParamTensor> tensors;
  size_t total = 0;

  // Tensor indices; -1 where the family has none (learned positions, the final norm's bias; the
  // head when tied).
  int embed = -1, positions = -1, norm_weight = -1, norm_bias = -1, head = -1;
  // Layer l's first tensor (its layer_tensors(l) tensors follow), and its (first) tensor of a
  // role. A layer is of one of two kinds (dense, or a mixture of experts: MoeShape::layer), each
  // with its own table (layer_params).
  int layer_begin(int l) const { return layer_first_[size_t(l)]; }
  int layer(int l, LayerRole r) const { return layer_begin(l) + position(l, r); }
  bool has(int l, LayerRole r) const { return position(l, r) >= 0; }
  int layer_tensors(int l) const { return kind_tensors_[kind(l)]; }
  int kind(int l) const { return shape.moe.layer(l) ? 1 : 0; }
  int position(int l, LayerRole r) const { return role_position_[kind(l)][r]; }
  const ParamTensor* find(const std::string& name) const;

  std::vector<int> layer_first_;            // by layer: its first tensor
  int kind_tensors_[2] = {};                // the tensors of a dense and of an MoE layer
  int role_position_[2][kLayerRoles] = {};  // each role's first tensor in a layer, or -1
};

ParamLayout make_param_layout(const ModelShape& shape);

// Model FLOPs per trained token (forward + backward), FORMULAS.md convention:
// 6 * (matmul parameters, LM head Vp*C included) + 12 * L * C * T for attention, unmasked;
// an MoE layer's matmul parameters are its active ones (the router and top_k experts).
double flops_per_token(const ModelShape& shape, int seq_len);

}  // namespace tessera
