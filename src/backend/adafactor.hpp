#pragma once
// Adafactor's hyper-parameters and the description of the piece of a tensor an update op works
// on, read by the adafactor_* ops of each backend (backend/cpu/ops.hpp, backend/cuda/ops.hpp);
// the update rule (optim/adafactor.hpp) holds them for its steps.
//
// The rule (Shazeer & Stern 2018, "Adafactor", with an external learning rate: HF transformers'
// Adafactor with relative_step = scale_parameter = False, the first moment after the clipping),
// for a tensor with gradient G at step t:
//   β2_t = 1 - t^decay_rate
//   matrix [R, C]:  r = β2_t r + (1 - β2_t) (mean_j G_ij² + eps)       (R row statistics)
//                   c = β2_t c + (1 - β2_t) (mean_i G_ij² + eps)       (C column statistics)
//                   U_ij = G_ij / sqrt(r_i c_j / mean(r))
//   vector [n]:     v = β2_t v + (1 - β2_t) (G² + eps);   U = G / sqrt(v)
//   U /= max(1, RMS(U) / clip_threshold)                   (RMS over the whole tensor)
//   beta1 > 0:      m = β1 m + (1 - β1) U;  U = m
//   W = W (1 - lr weight_decay) - lr U                     (decay where the tensor has it)
#include <cmath>
#include <cstddef>

namespace tessera {

struct AdafactorHyper {
  double beta1 = 0.9;            // first moment; 0 = none kept
  double decay_rate = -0.8;      // β2_t = 1 - t^decay_rate
  double eps = 1e-30;            // added to the mean squares
  double clip_threshold = 1.0;   // d of the update's RMS clipping
  double weight_decay = 0.1;     // decoupled, as AdamW's
  // β2_t at 1-based step t.
  double beta2(long t) const { return 1.0 - std::pow(double(t), decay_rate); }
};

// Where a piece of a matrix sits in its canonical tensor [rows, cols]: element k of the piece is
// element first + k of a row-major local block of `cols` columns, whose local row r is canonical
// row row0 + r and local column c is canonical column col0 + c. (A tensor-parallel shard holds
// one or more such blocks, model/shard.hpp; a ZeRO slice may start anywhere in one.)
struct MatrixWindow {
  size_t first = 0, cols = 1, row0 = 0, col0 = 0;
};

// The second-moment estimate a piece of n elements reads: factored (row, col: the tensor's
// canonical statistics after this step's update, row_mean: one float, mean(row); window: where
// the piece is) or, for a vector, one per element (v, at the piece; adafactor_rms updates it).
// Pointers into the backend's memory.
struct SecondMoment {
  const float* row = nullptr;
  const float* col = nullptr;
  const float* row_mean = nullptr;
  MatrixWindow window;
  float* v = nullptr;
  bool factored() const { return v == nullptr; }
};

}  // namespace tessera
