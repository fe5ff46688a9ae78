// The rules' declarations (optim/rule.hpp): their state, its host layout, their working buffers,
// and the rule an optimizer is built with.
#include "optim/rule.hpp"

#include "backend/cpu/backend.hpp"
#include "optim/adafactor.hpp"
#include "optim/adamw.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

bool StateSpec::holds(const ParamTensor& c) const {
  const bool matrix = c.shape.size() == 2;
  if (shape != StateShape::Elementwise && !matrix) return false;
  return of == StateOf::Every || (of == StateOf::Matrices) == matrix;
}

std::vector<size_t> StateSpec::shape_of(const ParamTensor& c) const {
  if (shape == StateShape::Rows) return {c.shape[0]};
  if (shape == StateShape::Cols) return {c.shape[1]};
  return c.shape;
}

size_t StateSpec::numel(const ParamTensor& c) const {
  size_t n = 1;
  for (size_t d : shape_of(c)) n *= d;
  return n;
}

StateHostLayout state_host_layout(const StateSpec& spec, const LocalLayout& layout,
                                  size_t elementwise_total) {
  StateHostLayout out;
  out.offset.assign(layout.tensors.size(), StateHostLayout::kNone);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const LocalTensor& t = layout.tensors[i];
    const ParamTensor& c = layout.canon(t);
    if (!spec.holds(c)) continue;
    if (spec.whole()) {
      out.offset[i] = out.total;
      out.total += spec.numel(c);
    } else {
      out.offset[i] = t.offset;
    }
  }
  if (!spec.whole()) out.total = elementwise_total;
  return out;
}

bool rule_named(const std::string& name, OptimRule* rule) {
  for (OptimRule r : {OptimRule::AdamW, OptimRule::Adafactor})
    if (name == deck_word(r)) {
      *rule = r;
      return true;
    }
  return false;
}

bool known_rule(const std::string& name) {
  OptimRule r;
  return rule_named(name, &r);
}

std::vector<StateSpec> rule_state_names(const std::string& name) {
  using S = StateShape;
  using O = StateOf;
  if (name == "adamw")
    return {{"exp_avg", S::Elementwise, O::Every}, {"exp_avg_sq", S::Elementwise, O::Every,
                                                    "float32", true}};
  if (name == "adafactor")
    return {{"exp_avg", S::Elementwise, O::Every},
            {"exp_avg_sq", S::Elementwise, O::Vectors, "float32", true},
            {"exp_avg_sq_row", S::Rows, O::Matrices, "float32", true},
            {"exp_avg_sq_col", S::Cols, O::Matrices, "float32", true}};
  return {};
}

std::vector<StateSpec> rule_state(const OptimHyper& hyper) {
  std::vector<StateSpec> out = rule_state_names(deck_word(hyper.rule));
  // Adafactor keeps a first moment only with beta1 > 0.
  if (hyper.rule == OptimRule::Adafactor && hyper.adafactor.beta1 == 0) out.erase(out.begin());
  return out;
}

RulePlan plan_rule(const OptimHyper& hyper, const LocalLayout& tile) {
  RulePlan plan{rule_state(hyper), {}};
  if (hyper.rule == OptimRule::Adafactor) plan.work = adafactor_work(tile);
  return plan;
}

template <class Backend>
std::unique_ptr<UpdateRule<Backend>> make_rule(const OptimHyper& hyper,
                                               const RuleSetup<Backend>& setup) {
  if (hyper.rule == OptimRule::Adafactor)
    return std::make_unique<AdafactorRule<Backend>>(hyper.adafactor, setup);
  return std::make_unique<AdamWRule<Backend>>(hyper.adamw, setup);
}

template std::unique_ptr<UpdateRule<CpuBackend>> make_rule(const OptimHyper&,
                                                           const RuleSetup<CpuBackend>&);
#ifdef TESSERA_CUDA
template std::unique_ptr<UpdateRule<CudaBackend<float>>> make_rule(
    const OptimHyper&, const RuleSetup<CudaBackend<float>>&);
template std::unique_ptr<UpdateRule<CudaBackend<cuda::bf16>>> make_rule(
    const OptimHyper&, const RuleSetup<CudaBackend<cuda::bf16>>&);
#endif

}  // namespace tessera
