#pragma once
// AdamW's hyper-parameters, read by the update op of each backend (adamw_update in
// backend/cpu/ops.hpp and backend/cuda/ops.hpp); the optimizer (optim/distributed.hpp) holds
// them for its steps.
namespace tessera {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

}  // namespace tessera
