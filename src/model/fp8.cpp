#include "model/fp8.hpp"

#include <algorithm>
#include <cmath>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "common/error.hpp"
#include "parallel/comm.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

Fp8State::Fp8State(const Fp8Options& options, int begin, int end, bool head)
    : options_(options), begin_(begin), end_(end), head_(head) {
  const size_t n = size_t(end - begin) * kPerLayer + (head ? kRoles : 0);
  history_.assign(n * size_t(H()), -1.0f);
  pending_.assign(n, 0.0f);
}

int Fp8State::tensor(int layer, int gemm, Role role) const {
  return first(layer) + gemm * kRoles + role;
}

float Fp8State::scale(int i, float current) const {
  const float* h = history_.data() + size_t(i) * H();
  float amax = h[0];
  if (!options_.most_recent)
    for (int k = 1; k < H(); ++k) amax = std::max(amax, h[k]);
  if (amax < 0) amax = current;  // the first step: no history yet
  const Role role = Role(i % kRoles);
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  const float s = std::ldexp(fp8_max(format(role)) / amax, -options_.margin);
  return s > 0 && std::isfinite(s) ? s : 1.0f;
}

void Fp8State::commit() {
  const size_t h = size_t(H());
  for (size_t i = 0; i < pending_.size(); ++i) {
    float* row = history_.data() + i * h;
    std::copy_backward(row, row + h - 1, row + h);
    row[0] = pending_[i];
  }
  discard();
}

void Fp8State::discard() { std::fill(pending_.begin(), pending_.end(), 0.0f); }

std::vector<float> Fp8State::history(int layer) const {
  const auto at = history_.begin() + long(first(layer)) * H();
  return {at, at + long(rows(layer)) * H()};
}

void Fp8State::set_history(int layer, const std::vector<float>& h) {
  if (h.size() != size_t(rows(layer)) * H())
    throw UserError("fp8 amax history of layer " + std::to_string(layer) + ": " +
                    std::to_string(h.size()) + " values, expected " +
                    std::to_string(size_t(rows(layer)) * H()));
  std::copy(h.begin(), h.end(), history_.begin() + long(first(layer)) * H());
}

template <class Backend>
Fp8Linear<Backend>::Fp8Linear(const Fp8Options& options, int begin, int end, bool head, Comm* tp,
                              Comm* cp, size_t max_input, size_t max_weight, size_t max_grad,
                              Arena& arena)
    : state_(options, begin, end, head), tp_(tp), cp_(cp), arena_(&arena) {
  h_input_ = arena.add("fp8: quantized GEMM input", max_input * sizeof(Act));
  h_weight_ = arena.add("fp8: quantized GEMM weight", max_weight * sizeof(Act));
  h_grad_ = arena.add("fp8: quantized GEMM output gradient", max_grad * sizeof(Act));
}

template <class Backend>
void Fp8Linear<Backend>::bind() {
  input_ = arena_->get<Act>(h_input_);
  weight_ = arena_->get<Act>(h_weight_);
  grad_ = arena_->get<Act>(h_grad_);
}

template <class Backend>
const typename Backend::Act* Fp8Linear<Backend>::quantize(Act* buffer, const Act* x, size_t n,
                                                          int tensor, Fp8State::Role role) {
  const float amax = Backend::fp8_amax(x, n);
  state_.observe(tensor, amax);
  float current = amax;
  if (!state_.has_history(tensor)) {
    // The first step: this GEMM's own amax, the same on every rank of the tile (MPI's max of
    // a NaN is unspecified: infinity stands in, and the step is judged at its end).
    if (std::isnan(current)) current = INFINITY;
    host_all_reduce_max(tp_->mpi(), &current, 1);
    if (cp_ != nullptr) host_all_reduce_max(cp_->mpi(), &current, 1);
  }
  Backend::fp8_quantize(buffer, x, n, state_.scale(tensor, current), state_.format(role));
  return buffer;
}

template <class Backend>
void Fp8Linear<Backend>::forward(int layer, int gemm, Act* out, const Act* inp, const Act* weight,
                                 const Act* bias, int N, int IC, int OC) {
  auto id = [&](Fp8State::Role r) { return state_.tensor(layer, gemm, r); };
  const Act* qx = quantize(input_, inp, size_t(N) * IC, id(Fp8State::kInput), Fp8State::kInput);
  const Act* qw =
      quantize(weight_, weight, size_t(OC) * IC, id(Fp8State::kWeight), Fp8State::kWeight);
  Backend::matmul_forward(out, qx, qw, bias, N, IC, OC);
}

template <class Backend>
void Fp8Linear<Backend>::backward(int layer, int gemm, Act* dinp, float* dweight, float* dbias,
                                  const Act* dout, const Act* inp, const Act* weight, int N,
                                  int IC, int OC) {
  auto id = [&](Fp8State::Role r) { return state_.tensor(layer, gemm, r); };
  // The forward's quantized input and weight again: the same tensors at the same scales.
  const Act* qx = quantize(input_, inp, size_t(N) * IC, id(Fp8State::kInput), Fp8State::kInput);
  const Act* qw =
      quantize(weight_, weight, size_t(OC) * IC, id(Fp8State::kWeight), Fp8State::kWeight);
  const Act* qg = quantize(grad_, dout, size_t(N) * OC, id(Fp8State::kGrad), Fp8State::kGrad);
  float* const no_bias = nullptr;
  Backend::matmul_backward(dinp, dweight, no_bias, qg, qx, qw, N, IC, OC);
  if (dbias) Backend::bias_backward(dbias, dout, N, OC);
}

template class Fp8Linear<CpuBackend>;
template Fp8Linear<DeclareBackend<float>>::Fp8Linear(const Fp8Options&, int, int, bool, Comm*,
                                                     Comm*, size_t, size_t, size_t, Arena&);
template Fp8Linear<DeclareBackend<Bf16Bytes>>::Fp8Linear(const Fp8Options&, int, int, bool, Comm*,
                                                         Comm*, size_t, size_t, size_t, Arena&);
#ifdef TESSERA_CUDA
template class Fp8Linear<CudaBackend<float>>;
template class Fp8Linear<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
