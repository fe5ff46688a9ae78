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

// An MoE layer's MLP (model/moe_layer.hpp) on this rank, in place of the dense MLP's GEMMs: the
// router's product on every row (replicated over tp: each tp rank routes all of them), one
// expert's fc1 and fc2 (this rank's columns; every expert alike), and per token the dispatch's
// streaming: the gather writes its k rows of C in expert order, the combine reads them back, each
// reading and writing k C elements. The planner gives each expert the balanced share n k / E of
// a micro-batch's n rows (the balancing losses' aim; a busier expert would take longer).
struct MoeCost {
  int experts = 0, top_k = 0;
  LinearGemm router{};
  std::vector<LinearGemm> expert;  // fc1, fc2
  double dispatch_elems = 0;       // per token, forward (the backward moves about twice as much)
  double route_elems = 0, route_exps = 0;  // per token: the logits and scores, their exps
  int forward_kernels = 0;  // the router's GEMM, scores and top-k, the plan's two host copies,
                            // the gather, combine and statistics; each expert's three
};

struct BlockCost {
  BlockWidths width;
  // In the forward's order, gemms[i].gemm == i; an MoE layer's are the attention's two (and its
  // shared experts' fc1 and fc2), its routed MLP in `moe`.
  std::vector<LinearGemm> gemms;
  MoeCost moe;  // experts == 0: a dense layer
  // The forward's streaming ops per row, elements read and written (the backward moves about
  // twice as much). On the residual stream's rows (n / tp under sequence parallelism): the two
  // norms (C in, C out) and the two residual adds (2 C in, C out). On every row: one elementwise
  // pass over each GEMM output but fc2's (the biases; the rotary embedding of q and k), as the
  // planner's model counts them.
  double residual_elems = 0, gemm_out_elems = 0;
  // The MLP's activation per row: elements read and written, and exps (GELU's tanh, SwiGLU's
  // SiLU). SwiGLU reads gate and up (3 f in all) but is priced at GELU's 2 f: the planner's
  // published-run checks (tools/plan_published.py) were fit on it.
  // An MoE layer's activation runs on the k rows of each token (k times the expert's width).
  double activation_elems = 0, activation_exps = 0;
  int sections = 2;        // attention, MLP
  int forward_kernels = 12;  // launches: the GEMMs, norms, biases, activation, adds, softmax
};
// A dense layer's cost, or with `moe` an MoE layer's (shape.moe's experts).
BlockCost block_cost(const ModelShape& shape, int tp, bool moe = false);
// The model's stage of layers [begin, end): how many are MoE layers.
int moe_layers(const ModelShape& shape, int begin, int end);

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
// Parameters of the whole model: every one, those one token's forward multiplies by (dense ones,
// the routers and top_k of each MoE layer's E experts), and the experts' (their fc1 and fc2
// tensors, biases too; the router counts as dense: it is replicated like the dense layers).
struct ParamCounts {
  double total = 0, active = 0, expert = 0;
};
ParamCounts param_counts(const ModelShape& shape);
// One layer's norm parameters, and the final norm's: those whose gradients sequence
// parallelism leaves partial on each tensor-parallel rank (each norm sees this rank's rows).
double layer_norm_params(const ModelShape& shape);
double final_norm_params(const ModelShape& shape);

}  // namespace tessera
