#pragma once
// AdamW as an update rule (optim/rule.hpp): torch.optim.AdamW with decoupled weight decay (none
// on biases and norm weights) and bias-corrected moments, exp_avg and exp_avg_sq, one value per
// parameter each (rule_state). Each piece is one backend op (adamw_update); nothing is summed
// between ranks, so every ZeRO stage shards both moments like the parameters.
#include "optim/rule.hpp"

namespace tessera {

template <class Backend>
class AdamWRule final : public UpdateRule<Backend> {
 public:
  AdamWRule(const AdamWHyper& hyper, const RuleSetup<Backend>& setup);
  void step(const StepView<Backend>& view, double lr, long t) override;

 private:
  AdamWHyper hyper_;
  const LocalLayout& tile_;
  const std::vector<Piece>& pieces_;
};

}  // namespace tessera
