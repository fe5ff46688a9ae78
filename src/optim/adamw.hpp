#pragma once
// AdamW (torch.optim.AdamW semantics: decoupled weight decay, bias-corrected moments) and the
// pieces of global-norm gradient clipping.
#include <cstddef>

namespace tessera {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One update of n elements of one tensor; `t` is the 1-based Adam step, `decay` whether weight
// decay applies (2-D tensors, not biases or norm weights).
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, bool decay,
                  const AdamWHyper& hyper, double lr, long t);

// Sum of squares of x[0, n) in double, in an order that depends on n alone (not the thread count),
// so a run restarted with another OMP_NUM_THREADS still agrees to the bit.
double sum_of_squares(const float* x, size_t n);

// torch's clip_grad_norm_ factor: max_norm / (norm + 1e-6) when that is below 1, else 1.
double clip_factor(double norm, double max_norm);
void scale(float* x, size_t n, float factor);

}  // namespace tessera
