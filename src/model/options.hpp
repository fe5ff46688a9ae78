#pragma once
// How the model runs, beside what it is (model/param_layout.hpp): choices that change memory and
// speed but not the trained model, so a restart may change them.
#include <string>

#include "config/config.hpp"

namespace tessera {

// train.recompute: which activations the backward recomputes instead of keeping.
//   None       every layer's activations are kept from the forward
//   Selective  the attention core (probabilities or log-sum-exp, and its output) is recomputed
//              from the kept q, k, v, as Megatron-LM's selective recompute
//   Full       only each layer's input is kept; the backward reruns the layer's forward first
enum class Recompute { None, Selective, Full };

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
};

// The options a deck asks for (its keys are validated by the deck reader).
ModelOptions model_options(const Config& config);

}  // namespace tessera
