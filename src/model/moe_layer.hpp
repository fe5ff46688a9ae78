#pragma once
// A mixture-of-experts MLP (model.moe) in place of a layer's dense MLP, forward and backward on
// this rank, op per line: the router's GEMM, its scores, top-k choice and gates
// (backend/moe_routing.hpp), the tokens' rows gathered in expert order (model/moe_dispatch.hpp),
// each expert's fc1, activation and fc2 on its block of rows, the rows back into token order
// weighted by their gates. The balancing losses (the auxiliary loss, the z-loss) are added to the
// objective through the router's backward.
//
// Tensor parallelism splits every expert as the dense MLP is split (fc1 column-parallel by each
// expert's rows, fc2 row-parallel): every tp rank routes all N tokens the same way (the router is
// replicated and reads the gathered norm output), computes its columns of every expert, and
// the block's reduction after fc2 sums the partial products as for the dense MLP. fc2's bias is
// added on tp rank 0 only, so it is in the sum once. The gates' gradient reads the whole
// expert output: its partial dot products are summed over tp (N k numbers).
//
// Whole experts (parallel.expert_tp = 1, with sequence parallelism): each tp rank holds its
// experts whole and routes only its own 1/tp of the rows (the block calls it on them, before any
// gather); nothing is summed over tp but the router's statistics (as cp's, below) and, by the
// engine, the router's gradient.
//
// Context parallelism: each rank routes its own tokens; the balancing losses read sums over the
// whole micro-batch (the router's statistics and the experts' loads summed over cp), so every
// layout optimises the same objective.
//
// Expert parallelism (parallel.ep): the ep ranks (data-parallel ranks, each with micro-batches of
// its own) hold E / ep experts each. Each rank routes its own tokens, sends each expert's rows to
// the rank holding it and gets their outputs back (an all-to-all each way, the row counts
// exchanged first); the backward sends the outputs' gradients and returns the inputs'. The
// received rows are put in expert order (by expert, then by source rank, then in the source's
// order), so every layout gives an expert the same rows in the same order.
//
// DeepSeek-V3's auxiliary-loss-free balancing (model.moe.bias_rate > 0; DeepSeek-V3 report
// §2.1.2): each layer's selection bias b (E floats, fp32) is added to the scores for the choice
// only, not the gates. After every applied step it moves bias_rate toward balance: b_e += rate
// sign(mean load - load_e), the loads counted over the step's whole batch (every micro-batch of
// every data-parallel rank: the engine sums step_loads() over dp x cp), so every rank holds the
// same bias. It is state, not a parameter: checkpoints keep it (/train/moe_bias).
//
// The choice is read back to the host once per layer and micro-batch (the dispatch plan is host
// code); the plan and the exchange's are kept per slot and layer for the backward.
//
// FP8 (device.precision fp8, model/fp8.hpp): the experts' fc1 and fc2 run on FP8 codes, each
// expert's weight at a scale of its own, all the held experts' rows at one scale per layer and
// GEMM role; so each pass computes every expert's fc1 before any fc2 (the activation's rows
// whole for their scale), and the backward every fc2 before any fc1. The router stays in the
// compute type.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/arena.hpp"
#include "backend/moe_routing.hpp"
#include "model/family.hpp"
#include "model/fp8.hpp"
#include "model/moe_dispatch.hpp"
#include "model/options.hpp"
#include "model/param_layout.hpp"

namespace tessera {

// What the layers routed during a step (summed over its micro-batches), for the log.
struct MoeLayerStats {
  double aux_loss = 0, z_loss = 0;  // the balancing losses, as added to the objective
  double max_load = 0, mean_load = 0;  // tokens of the busiest expert, and per expert
  int64_t dropped = 0;                 // choices past the capacity
};

template <class Backend>
class MoeLayer {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // Layer l's tensors, by role (nullptr where the family has none), and their gradients.
  struct Params {
    const Act *router, *fc1, *fc1_bias, *fc2, *fc2_bias;
    float *drouter, *dfc1, *dfc1_bias, *dfc2, *dfc2_bias;
  };

  // layers: this chunk's MoE layers (their model indices); slots: the micro-batches kept.
  // Declares its buffers in `arena`. cp and ep may be nullptr (one rank). rows_tp: with whole
  // experts on every tp rank (parallel.expert_tp = 1; tp then nullptr), the tp group over which
  // the micro-batch's rows are split, whose router statistics are summed as cp's.
  MoeLayer(const ModelShape& shape, const BlockWidths& width, const MoeOptions& options,
           std::vector<int> layers, int slots, int max_n, Comm* tp, Comm* cp, Comm* ep,
           Arena& arena, Comm* rows_tp = nullptr);
  // Whether it takes this rank's own rows (whole experts), not the rows gathered over tp.
  bool own_rows() const { return rows_tp_ != nullptr; }
  // fp8: the chunk's FP8 GEMMs, which then run the experts' (nullptr: the compute type's).
  void bind(Fp8Linear<Backend>* fp8 = nullptr);
  bool routed(int layer) const { return index_of(layer) >= 0; }
  // Layer `layer`'s MoE MLP on micro-batch `slot`: x (N,C) the gathered norm output; out (N,C)
  // this rank's partial product (summed over tp by the caller), or with `accumulate` added to it
  // (the shared experts' output). `record`: add to the step's stats (not when full recompute
  // reruns the forward).
  void forward(Act* out, const Act* x, const Params& w, int layer, int slot, int N, bool record,
               bool accumulate = false);
  // Its backward: dout (N,C) the whole output's gradient; dx (N,C) accumulates this rank's
  // partial input gradient. weight: the objective's weight of this micro-batch's mean loss (the
  // balancing losses are scaled by it as the cross-entropy is).
  void backward(Act* dx, const Act* dout, const Act* x, const Params& w, int layer, int slot,
                int N, double weight);
  // The bytes of the kept activations (every slot and layer) and of the scratch.
  size_t activation_bytes() const;
  std::vector<MoeLayerStats>& stats() { return stats_; }  // by this chunk's MoE layer
  const std::vector<int>& layers() const { return layers_; }
  int held() const { return shape_.moe.experts / ep_size_; }  // experts on this rank
  int first_held() const { return ep_ != nullptr ? ep_->rank() * held() : 0; }
  // The most rows the held experts compute in one layer and micro-batch (R = N k without ep).
  size_t rows_in() const;

  // The auxiliary-loss-free bias (bias_rate > 0): each layer's choices this step, by this
  // chunk's MoE layer then expert (zeroed by the caller at the step's start; recomputed
  // forwards not counted). The caller sums them over the step's batch in place, then move_bias
  // moves the bias by them.
  std::vector<double>& step_loads() { return step_loads_; }
  void move_bias();
  // The bias by this chunk's MoE layer then expert (zero at the start), and set from a checkpoint.
  const std::vector<float>& bias() const { return host_bias_; }
  void set_bias(const std::vector<float>& bias);

 private:
  // One slot and layer's kept activations: in token order the logits; in this rank's expert
  // order the rows sent (xs) and their outputs received back (y); in the held experts' order
  // the rows they compute (xe: received; ye: their outputs; the same as xs and y without ep),
  // fc1's output h and the activation a.
  struct Kept {
    Act *logits, *xs, *y, *xe, *h, *a, *ye;
    float *scores, *gates;
    int32_t *choice, *token_of, *slot_of, *to_expert, *to_source;
  };
  // The exchange of one slot and layer (ep > 1): rows sent to and received from each ep rank,
  // and the rows each held expert computes.
  struct Exchange {
    std::vector<int> send_rows, recv_rows, counts, offsets;
  };
  int index_of(int layer) const;
  size_t at(int layer, int slot) const { return size_t(slot) * layers_.size() + size_t(index_of(layer)); }
  Kept kept(int layer, int slot) const;
  // Sends the routed rows' counts and builds the exchange's row maps (into p.to_expert and
  // p.to_source) from the plan.
  void plan_exchange(const MoeDispatch& d, const Kept& p, Exchange* x);
  // The held experts' fc1 or fc2 (gemm: Fp8State::kFc1, kFc2), each on its block of rows
  // (counts, offsets): one GEMM per expert on FP8 codes, or the backend's experts ops.
  void experts_forward(int layer, int gemm, Act* out, const Act* in, const Act* weight,
                       const Act* bias, const std::vector<int>& counts,
                       const std::vector<int>& offsets, int IC, int OC);
  void experts_backward(int layer, int gemm, Act* din, float* dweight, float* dbias,
                        const Act* dout, const Act* in, const Act* weight,
                        const std::vector<int>& counts, const std::vector<int>& offsets, int IC,
                        int OC);
  // FP8: all the held experts' rows of one GEMM role before their blocks are cast.
  void expert_rows(int layer, int gemm, Fp8State::Role role, const Act* x, size_t n) {
    if (fp8_) fp8_->expert_rows(layer, gemm, role, x, n);
  }
  Act* exchange_scratch() const;  // ep > 1: two buffers of the most rows the experts compute

  ModelShape shape_;
  BlockWidths width_;
  MoeOptions options_;
  MlpKind mlp_;
  std::vector<int> layers_;
  int slots_, max_n_;
  Comm *tp_, *cp_, *ep_, *rows_tp_;
  int ep_size_ = 1;
  // The micro-batch's rows over this rank's: cp ranks times (whole experts) tp ranks.
  int row_split() const;
  Arena* arena_;
  size_t h_act_ = 0, h_float_ = 0, h_int_ = 0, h_scratch_ = 0, h_fscratch_ = 0, h_stats_ = 0;
  size_t act_per_ = 0, float_per_ = 0, int_per_ = 0;  // one layer and slot's kept elements
  Act *acts_ = nullptr, *scratch_ = nullptr;
  float *floats_ = nullptr, *fscratch_ = nullptr;
  int32_t* ints_ = nullptr;
  double* router_stats_ = nullptr;  // (2E + 1): Σ_t p[t,e], Σ_t lse², the loads
  std::vector<MoeDispatch> plans_;  // by slot and layer
  std::vector<Exchange> exchanges_;  // by slot and layer (ep > 1)
  // By slot and layer: each expert's load and the dropped choices, over the micro-batch's cp ranks.
  std::vector<std::vector<double>> loads_;
  std::vector<int32_t> host_choice_;
  std::vector<double> host_stats_;
  std::vector<MoeLayerStats> stats_;
  size_t h_bias_ = 0;
  float* bias_ = nullptr;            // bias_rate > 0: the device's copy of host_bias_
  std::vector<float> host_bias_;     // by layer then expert
  std::vector<double> step_loads_;   // by layer then expert
  Fp8Linear<Backend>* fp8_ = nullptr;
};

}  // namespace tessera
