#pragma once
// What one layer costs on this rank, read from its family's description (model/family.hpp): the
// planner (plan/step_time.cpp, plan/comm.cpp) prices these numbers and nothing else describes a
// layer to it, and the model (model/transformer_block.cpp) runs its linear layers at these GEMMs'
// shapes.
//   GEMMs        each linear layer's product for n rows of a micro-batch; the planner prices its
//                forward, its input gradient and its weight gradient
//   streaming    elements the elementwise ops read and write per row, and their exps
//   collectives  the block's tensor-parallel sections, each entered by a column-parallel GEMM
//                and left by a row-parallel one (tp_collectives)
// The attention core (its products and softmax over this rank's heads, BlockWidths) is the same
// in every family; the planner prices it from the widths.
#include <vector>

#include "model/family.hpp"
#include "model/fp8.hpp"

namespace tessera {

// One linear layer: out (n, out) = in (n, in) · W (out, in)ᵀ, W the local shards of its role's
// tensors (the row-parallel ones' input is this rank's columns; their output a partial sum).
struct LinearGemm {
  int gemm;          // Fp8State::Gemm: the FP8 state of its tensors (model/fp8.hpp)
  LayerRole weight;  // its weight's role in the layer's table
  int out, in;       // this rank's columns
};

struct BlockCost {
  BlockWidths width;
  std::vector<LinearGemm> gemms;  // in the forward's order, gemms[i].gemm == i
  // The forward's streaming ops per row, elements read and written (the backward moves about
  // twice as much). On the residual stream's rows (n / tp under sequence parallelism): the two
  // norms (C in, C out) and the two residual adds (2 C in, C out). On every row: one elementwise
  // pass over each GEMM output but fc2's (the biases; the rotary embedding of q and k), as the
  // planner's model counts them.
  double residual_elems = 0, gemm_out_elems = 0;
  // The MLP's activation per row: elements read and written, and exps (GELU's tanh, SwiGLU's
  // SiLU). SwiGLU reads gate and up (3 f in all) but is priced at GELU's 2 f: the planner's
  // published-run checks (tools/plan_published.py) were fit on it.
  double activation_elems = 0, activation_exps = 0;
  int sections = 2;        // attention, MLP
  int forward_kernels = 12;  // launches: the GEMMs, norms, biases, activation, adds, softmax
};
BlockCost block_cost(const ModelShape& shape, int tp);

// Tensor-parallel collectives per layer and micro-batch: one all-reduce per section forward and
// one backward (and the full recompute's rerun, one more); under sequence parallelism per
// section an all-gather in and a reduce-scatter out forward, in the backward an all-gather of
// the output's gradient, a re-gather of the norm output for the weight gradient and a
// reduce-scatter of the input's gradient (and the rerun's two).
int tp_collectives(const BlockCost& cost, bool sequence_parallel, bool full_recompute);

// One dense layer's parameters in GEMMs (FORMULAS.md's N_matmul is L of them plus the head's
// Vp C).
double layer_matmul_params(const ModelShape& shape);
// Every layer's active parameters in GEMMs: a dense layer's, an MoE layer's router and top_k of
// its experts (what one token's forward multiplies by).
double active_matmul_params(const ModelShape& shape);
// One layer's norm parameters, and the final norm's: those whose gradients sequence
// parallelism leaves partial on each tensor-parallel rank (each norm sees this rank's rows).
double layer_norm_params(const ModelShape& shape);
double final_norm_params(const ModelShape& shape);

}  // namespace tessera
