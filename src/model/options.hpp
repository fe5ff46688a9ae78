#pragma once
// How the model runs, beside what it is (model/param_layout.hpp): choices that change memory and
// speed but not the trained model, so a restart may change them.
#include <string>

#include "backend/moe_routing.hpp"
#include "common/fp8_format.hpp"
#include "config/config.hpp"

namespace tessera {

// train.recompute's Recompute (config/config.hpp): which activations the backward recomputes.

// device.precision: fp8 (model/fp8.hpp): the linear layers' GEMMs on FP8 inputs, delayed scaling.
struct Fp8Options {
  bool on = false;
  Fp8Format grad = Fp8Format::E5M2;  // the output gradients' (fp8_format hybrid; e4m3: E4M3)
  int history = 16;                  // device.fp8_amax_history
  bool most_recent = false;          // device.fp8_amax_algo == most_recent
  int margin = 0;                    // device.fp8_margin
  bool head = false;                 // device.fp8_head
  // ZeRO-3: the layers' weight codes cast as each layer computes, into two layers' places, where
  // whole codes of every weight would undo the sharding (Fp8Linear).
  bool layer_codes = false;
};

// model.moe beyond the shape (model/moe_layer.hpp): the router's rule (its experts and top_k
// filled from the shape), the balancing losses' coefficients, the capacity.
struct MoeOptions {
  MoeRouting routing;
  double aux_loss = 0;         // the auxiliary loss's coefficient
  double z_loss = 0;           // the z-loss's coefficient
  double capacity_factor = 0;  // 0: dropless
  double bias_rate = 0;        // the auxiliary-loss-free balancing's step (0: no bias)
};

struct ModelOptions {
  bool fused_attention = false;    // model.attention == fused
  Recompute recompute = Recompute::None;
  // parallel.sequence_parallel (with tp > 1): the norms, residuals and the stage's input and
  // output hold this rank's 1/tp of the (B*T) rows; an all-gather before each column-parallel
  // GEMM and a reduce-scatter after each row-parallel one replace the all-reduces.
  bool sequence_parallel = false;
  // parallel.cp_comm == allgather (model/context_attention.hpp): K/V gathered whole per layer
  // instead of passed round the ring.
  bool cp_allgather = false;
  Fp8Options fp8 = {};
  MoeOptions moe = {};
  // data.document_mask: the attention sees each token's own document only; the engine hands
  // every stage each micro-batch's document starts (Gpt::forward's doc_start).
  bool document_mask = false;
};

// The options a deck asks for (its keys are validated by the deck reader).
ModelOptions model_options(const Config& config);

}  // namespace tessera
