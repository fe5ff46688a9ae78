#pragma once
// Linear warmup then cosine decay to min_lr. `step` is the 0-based optimizer step being taken.
#include <algorithm>
#include <cmath>

namespace tessera {

struct LrSchedule {
  double max_lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 0;
  int decay_steps = 1;  // min_lr is reached here

  double at(long step) const {
    if (step < warmup_steps) return max_lr * double(step + 1) / warmup_steps;
    const double span = std::max(1, decay_steps - warmup_steps);
    const double p = std::clamp(double(step - warmup_steps) / span, 0.0, 1.0);
    return min_lr + 0.5 * (1.0 + std::cos(3.141592653589793 * p)) * (max_lr - min_lr);
  }
};

}  // namespace tessera
