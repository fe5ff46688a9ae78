#pragma once
// AdamW's hyper-parameters and torch's clip factor; the update itself is a backend op
// (adamw_update in backend/cpu/ops.hpp and backend/cuda/ops.hpp).
namespace tessera {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// torch's clip_grad_norm_ factor: max_norm / (norm + 1e-6) when that is below 1, else 1.
inline double clip_factor(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace tessera
