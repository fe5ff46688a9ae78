#pragma once
// The MLP pieces a family composes (model/family.hpp): a dense MLP, fc1 (column-parallel), an
// activation, fc2 (row-parallel), of width F (model.ffn_hidden):
//   Gelu    GPT-2: h = c_fc x + b (F columns), a = GELU_tanh(h), out = c_proj a + b
//   SwiGlu  LLaMA: h = [gate x; up x] (this rank's gate columns, then its up columns),
//           a = SiLU(gate) * up, out = down a
// Their ops are model/transformer_block.cpp's mlp_forward and mlp_backward; their GEMMs and
// streaming cost model/cost.cpp's. A mixture of experts (a router, E experts of the family's
// dense kind) is a third kind: family.hpp says where each of its parts goes.
#include <cstddef>
#include <string>
#include <vector>

#include "model/family.hpp"

namespace tessera {

// The MLP's tensors, named under `prefix`: fc1's weights, their biases (with `bias`), fc2's weight
// and bias. fc1's tensors are column-parallel (rows split), fc2's weight row-parallel. An MoE
// layer's shared experts are one such MLP under "mlp.shared_experts.".
void mlp_params(MlpKind kind, bool bias, Init out_init, size_t C, size_t F,
                std::vector<LayerParam>* out, const std::string& prefix = "mlp.");
// An MoE layer's tensors, named under "mlp.": the router [E, C] (replicated over tp: every rank
// routes the same tokens the same way), then E experts of the dense kind, each tensor the E
// experts' stacked by rows (expert e's rows [e R, (e + 1) R) of a tensor of E R rows), split
// over tp as the dense MLP's (fc1 by the rows of each expert, fc2 by columns). GELU:
// experts.c_fc.weight [E F, C], experts.c_fc.bias [E F], experts.c_proj.weight [E C, F],
// experts.c_proj.bias [E C]; SwiGLU: experts.gate_up_proj.weight [E 2F, C] (each expert's F gate
// rows, then its F up rows), experts.down_proj.weight [E C, F]. Biases 1-D, weights 2-D (weight
// decay goes by that).
void moe_params(MlpKind kind, bool bias, Init out_init, size_t C, size_t F, size_t E,
                std::vector<LayerParam>* out);
// fc1's output columns for f activation columns: f, or SwiGLU's gate and up, 2 f.
int mlp_fc1_columns(MlpKind kind, int f);
// model.ffn_hidden: 0: GELU's 4 C; SwiGLU's 8 C / 3 (the parameters of GELU's 4 C in three
// matrices instead of two), rounded up to a multiple of `multiple` (LLaMA's rule).
int mlp_default_width(MlpKind kind, int C, int multiple);

}  // namespace tessera
