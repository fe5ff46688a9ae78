#pragma once
// AdamW over the flat buffers (torch.optim.AdamW semantics: decoupled weight decay, bias-corrected
// moments), and global-norm gradient clipping.
#include <cstddef>
#include <vector>

#include "model/param_layout.hpp"

namespace tessera {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One update of every tensor in `layout`; `t` is the 1-based Adam step. m and v have the
// parameters' offsets.
void adamw_step(float* params, const float* grads, float* m, float* v, const ParamLayout& layout,
                const AdamWHyper& hyper, double lr, long t);

// Sum of squares of x[0, n) in double, in an order that depends on n alone (not the thread count),
// so a run restarted with another OMP_NUM_THREADS still agrees to the bit.
double sum_of_squares(const float* x, size_t n);

// Scales grads by max_norm / (norm + 1e-6) when that is below 1 (torch's clip_grad_norm_).
void clip_gradients(float* grads, size_t n, double norm, double max_norm);

}  // namespace tessera
