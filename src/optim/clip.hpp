#pragma once
// Gradient clipping by the global norm: torch's clip factor, applied by the optimizer's step.
namespace tessera {

// torch's clip_grad_norm_ factor: max_norm / (norm + 1e-6) when that is below 1, else 1.
inline double clip_factor(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace tessera
