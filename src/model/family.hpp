#pragma once
// A model family (model.arch) is a description, not branches through the model. Its block is
// composed of pieces (a norm, the attention's q/k/v projections and positions, an MLP), each of
// a kind; the family picks the kinds and names its tensors. Everything a family changes is read
// from that description, written once:
//   parameter table   layer_params() here: a layer's tensors, names, shapes, initialisation and
//                     how each shards over tp (model/param_layout.cpp lays the tables out in the
//                     flat buffer, model/shard.cpp cuts them into tiles)
//   widths            block_widths() here: this rank's columns of each of a layer's activations
//   forward/backward  model/transformer_block.cpp: op per line, each piece's ops by its kind
//   cost              model/cost.cpp: the layer's GEMMs and streaming ops the planner prices
//
//   gpt2   learned positions, pre-LayerNorm with biases, one fused c_attn, GELU MLP, tied head,
//          GPT-2's state_dict names
//   llama  rotary positions on q and k, RMSNorm, grouped-query attention with q, k and v apart,
//          SwiGLU MLP, no biases, untied head, the names of Hugging Face's LlamaModel
//
// Adding a family whose pieces exist: an Arch value and its Family in family.cpp, and its deck
// name in config/validate.cpp (whose rules for n_kv_head, ffn_hidden and norm_eps still name gpt2
// and llama). Nothing else in src/ reads a family by name; tools/ (Hugging Face import and
// export, checkpoint inspection) keep their own table of each family's names.
// Adding a kind of piece (a mixture-of-experts MLP: a router and E experts of the family's dense
// MLP kind; another norm), one place per aspect:
//   its tensors      layer_params (family.cpp; an MLP's in model/mlp.cpp), each with its role
//                    (LayerRole: add roles for tensors no existing role describes, e.g. a router)
//   its widths       block_widths (family.cpp), and for an MLP mlp_fc1_columns (model/mlp.cpp)
//   its ops          model/transformer_block.cpp: a case in norm_forward/backward or
//                    mlp_forward/backward; activations it keeps beyond the dense MLP's, in
//                    model/gpt.cpp's slot plan
//   its cost         model/cost.cpp: its GEMMs (priced forward and backward by the planner; a
//                    new one needs an Fp8State::Gemm of its own), its streaming elements and
//                    exps; new traffic (the experts' all-to-all under ep) in plan/comm.cpp
//   its tests        tests/unit/test_family.cpp: table, widths and GEMMs agree with each other
#include <cstddef>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace tessera {

struct ModelShape;  // model/param_layout.hpp

// Arch (config/config.hpp): model.arch, typed where the deck is read.

enum class Init { Normal, ResidualNormal, Zeros, Ones };

// How a tensor shards over the tensor-parallel ranks (Megatron, DESIGN §4).
enum class Split {
  Replicated,  // whole on every rank: norms, and biases added after a row-parallel reduction
  Rows,        // column-parallel weights and their biases; the vocab-parallel embedding and head
  Columns,     // row-parallel weights
  QkvRows,     // a fused [q; k; v] (three equal row blocks): this rank's heads of each
  PartRows,    // `parts` equal row blocks (the experts' stacked fc1: E, or SwiGLU's 2 E), this
               // rank's rows of each
};

// The pieces' kinds.
enum class NormKind { LayerNorm, RmsNorm };  // LayerNorm: weight and bias, mean and rstd kept
enum class QkvLayout { Fused, Apart };       // q, k, v in one tensor [q; k; v], or three
enum class Positions { Learned, Rotary };    // a table added to the embedding, or RoPE on q, k
enum class MlpKind { Gelu, SwiGlu };         // model/mlp.hpp

// What each tensor of a layer is, the same in every family. A role may hold several tensors,
// adjacent in the buffer (LLaMA's q, k, v are kQkvW; its gate and up are kFc1W): one GEMM reads
// the local shards of a role's tensors together. fc1 is the MLP's first GEMM (GPT-2's c_fc,
// LLaMA's gate and up), fc2 its second (GPT-2's mlp.c_proj, LLaMA's down).
// An MoE layer (model/moe_layer.hpp) has a router (kRouterW) and its experts' fc1 and fc2 in
// place of the dense MLP's (kExpertFc1W...: each the E experts' tensors stacked by rows).
// model.qk_norm (llama): the per-head RMSNorm weights of q and k (kQkNormW: q_norm then k_norm,
// each of head size, replicated over tp; each tp rank's gradient sums over its heads only, so it
// is summed over tp: Gpt::tp_partial_gradients).
enum LayerRole {
  kNorm1W, kNorm1B, kQkvW, kQkvB, kProjW, kProjB, kNorm2W, kNorm2B, kFc1W, kFc1B, kFc2W, kFc2B,
  kRouterW, kExpertFc1W, kExpertFc1B, kExpertFc2W, kExpertFc2B, kQkNormW,
  kLayerRoles
};

// An MoE layer's experts' tensors (kExpertFc1W ... kExpertFc2B): split over ep, counted apart
// from the dense ones.
bool expert_role(LayerRole role);

// One tensor of a layer's parameter table.
struct LayerParam {
  LayerRole role;
  std::string name;           // after the layer's prefix, e.g. "mlp.c_fc.weight"
  std::vector<size_t> shape;  // [out, in] as nn.Linear, or [n]
  Init init;
  Split split;
  int parts = 1;              // Split::PartRows: the row blocks
};

struct Family {
  Arch arch;
  const char* name;            // model.arch, and a checkpoint's /model arch attribute
  // Outside the layers.
  const char* embed;           // the token embedding
  const char* position_table;  // the learned positions (Positions::Learned), else nullptr
  const char* layers;          // layer l's tensors are "<layers><l>.<LayerParam::name>"
  const char* final_norm;      // the final norm's prefix (".weight", ".bias")
  const char* head;            // the LM head, when not tied to the embedding
  bool tied;                   // model.tie_embeddings: auto
  const char* tokenizer;       // its usual tokenizer and that one's vocabulary: what `tessera
  int vocab;                   // plan` assumes for model.vocab_size 0 without data to read
  // The block: its pieces' kinds, and the names of the modules holding them.
  NormKind norm;
  const char* norm1;           // before the attention
  const char* norm2;           // before the MLP
  QkvLayout qkv;
  Positions position;
  const char* attention;       // the attention's module: "<attention>.c_attn", ".q_proj", ...
  MlpKind mlp;                 // under "mlp."
  bool bias;                   // every linear layer adds a bias
  Init out_init;               // the projections back into the residual stream (attention, MLP)
};

const Family& family(Arch arch);
// The family of that model.arch name, or nullptr.
const Family* family_named(const std::string& name);
// Every family's name, for messages: "gpt2, llama".
std::string family_names();

// A norm piece's tensors: its weight (ones) and LayerNorm's bias (zeros), replicated over tp;
// `weight` and `bias` their roles in a layer (the final norm's are outside the layers).
void norm_params(const Family& f, const std::string& name, size_t C, std::vector<LayerParam>* out,
                 LayerRole weight = kNorm1W, LayerRole bias = kNorm1B);
// Layer l's parameter table, in buffer order: its norm, attention, norm, MLP (dense, or a
// mixture of experts where shape.moe says so).
std::vector<LayerParam> layer_params(const ModelShape& shape, int l);

// This rank's widths of a layer's activations under tp ranks: head size, its heads of q and of
// k/v, q's columns (nh hs), q, k and v's together, the MLP's activation (f) and fc1's output.
// An MoE layer's experts: each expert's activation columns (ef) and fc1 output (efc1) on this
// rank (the experts split over tp as the dense MLP is); the shared experts' MLP (sf, sfc1; 0
// without), split as the dense MLP.
struct BlockWidths {
  int hs = 0, nh = 0, nkv = 0, q = 0, qkv = 0, f = 0, fc1 = 0, ef = 0, efc1 = 0, sf = 0, sfc1 = 0;
};
BlockWidths block_widths(const ModelShape& shape, int tp);

}  // namespace tessera
