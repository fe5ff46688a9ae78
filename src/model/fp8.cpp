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

void Fp8State::discard() {
  std::fill(pending_.begin(), pending_.end(), 0.0f);
  ++generation_;
}

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
                              Comm* cp, const Fp8Sizes& sizes, Arena& arena)
    : state_(options, begin, end, head), tp_(tp), cp_(cp), arena_(&arena) {
  // Each place's codes, then their transpose: 2 bytes per element. Starts 16-byte aligned
  // (cuBLASLt's FP8 operands). A place per weight, or under layer_codes two layers' and the head's.
  const int layers = options.layer_codes ? std::min(2, end - begin) : end - begin;
  const int places = layers * Fp8State::kGemms + (head ? 1 : 0);
  weight_at_.assign(size_t(places), 0);
  cast_.assign(size_t(places), Cast{});
  part_scale_.assign(size_t(state_.tensors()), 1.0f);
  size_t total = 0;
  for (int w = 0; w < places; ++w) {
    const bool is_head = head && w == places - 1;
    weight_at_[size_t(w)] = total;
    const size_t n = is_head ? sizes.head : sizes.weight[w % Fp8State::kGemms];
    total += (2 * n + 15) / 16 * 16;
  }
  h_slots_ = arena.add("fp8: amaxes and scales",
                       (amax_slots() + kScaleSlot * size_t(state_.tensors())) * sizeof(float));
  h_weights_ = arena.add("fp8: weights (E4M3 codes and their transposes)", total);
  h_input_ = arena.add("fp8: GEMM input codes", sizes.input);
  h_grad_ = arena.add("fp8: output gradient codes", sizes.grad);
  h_grad_t_ = arena.add("fp8: output gradient codes, transposed", sizes.grad);
}

template <class Backend>
void Fp8Linear<Backend>::bind() {
  amax_ = arena_->get<float>(h_slots_);
  scale_inv_ = amax_ + amax_slots();
  weights_ = arena_->get<uint8_t>(h_weights_);
  input_ = arena_->get<uint8_t>(h_input_);
  grad_ = arena_->get<uint8_t>(h_grad_);
  grad_t_ = arena_->get<uint8_t>(h_grad_t_);
  Backend::zero(amax_, size_t(state_.tensors()) * sizeof(float));
  cast_.assign(cast_.size(), Cast{});
}

template <class Backend>
float Fp8Linear<Backend>::scale(const Act* x, size_t n, int tensor) {
  // The first step: this tensor's own amax, the same on every rank of the tile. A host read per
  // cast, in this step only.
  const float current = state_.has_history(tensor) ? 0.0f : tile_amax(Backend::fp8_amax(x, n));
  return state_.scale(tensor, current);
}

template <class Backend>
float Fp8Linear<Backend>::tile_amax(float amax, Comm* shard) {
  if (std::isnan(amax)) amax = INFINITY;  // MPI's max of a NaN is unspecified; judged at the end
  if (shard != nullptr) host_all_reduce_max(shard->mpi(), &amax, 1);
  host_all_reduce_max(tp_->mpi(), &amax, 1);
  if (cp_ != nullptr) host_all_reduce_max(cp_->mpi(), &amax, 1);
  return amax;
}

template <class Backend>
void Fp8Linear<Backend>::cast(uint8_t* out, uint8_t* out_t, const Act* x, int rows, int cols,
                              int tensor, Fp8State::Role role) {
  Backend::fp8_cast(out, out_t, x, rows, cols, scale(x, size_t(rows) * size_t(cols), tensor),
                    state_.format(role), amax_ + tensor, scale_inv(tensor));
}

template <class Backend>
const uint8_t* Fp8Linear<Backend>::weight_codes(int layer, int gemm, const Act* weight, int OC,
                                                int IC) {
  const int tensor = state_.tensor(layer, gemm, Fp8State::kWeight);
  const int w = tensor / Fp8State::kRoles;
  const size_t at = place(layer, gemm, w);
  uint8_t* codes = weights_ + weight_at_[at];
  Cast& c = cast_[at];
  if (c.weight != w || c.generation != state_.generation() || c.rows != OC || c.cols != IC) {
    if (codes_ != nullptr && layer == codes_layer_)
      Backend::fp8_place(codes, codes + size_t(OC) * IC, codes_ + (weight - codes_params_), OC, IC,
                         1.0f / part_scale_[size_t(tensor)], scale_inv(tensor));
    else
      cast(codes, codes + size_t(OC) * IC, weight, OC, IC, tensor, Fp8State::kWeight);
    c = {w, state_.generation(), OC, IC};
  }
  return codes;
}

template <class Backend>
void Fp8Linear<Backend>::cast_part(int layer, int gemm, const Act* x, size_t n, uint8_t* out,
                                   Comm* shard) {
  const int tensor = state_.tensor(layer, gemm, Fp8State::kWeight);
  // Every rank of the group takes part, its part of this weight empty or not.
  const float current = state_.has_history(tensor)
                            ? 0.0f
                            : tile_amax(n > 0 ? Backend::fp8_amax(x, n) : 0.0f, shard);
  const float s = state_.scale(tensor, current);
  part_scale_[size_t(tensor)] = s;
  // The part as rows of kRow elements and a shorter last one: the cast's 32 x 32 tiles full.
  constexpr size_t kRow = 1024;
  const size_t rows = n / kRow, tail = n % kRow;
  if (rows > 0)
    Backend::fp8_cast(out, nullptr, x, int(rows), int(kRow), s, Fp8Format::E4M3, amax_ + tensor,
                      scale_inv(tensor));
  if (tail > 0)
    Backend::fp8_cast(out + rows * kRow, nullptr, x + rows * kRow, 1, int(tail), s,
                      Fp8Format::E4M3, amax_ + tensor, scale_inv(tensor));
}

template <class Backend>
size_t Fp8Linear<Backend>::place(int layer, int gemm, int weight) const {
  if (!state_.options().layer_codes) return size_t(weight);
  if (layer == Fp8State::kHead) return cast_.size() - 1;
  return size_t((layer - state_.begin()) % 2) * Fp8State::kGemms + size_t(gemm);
}

template <class Backend>
void Fp8Linear<Backend>::forward(int layer, int gemm, Act* out, const Act* inp, const Act* weight,
                                 const Act* bias, int N, int IC, int OC) {
  const int x = state_.tensor(layer, gemm, Fp8State::kInput);
  const int w = state_.tensor(layer, gemm, Fp8State::kWeight);
  const uint8_t* qw = weight_codes(layer, gemm, weight, OC, IC);
  cast(input_, nullptr, inp, N, IC, x, Fp8State::kInput);
  Backend::fp8_gemm(out, operand(input_, x, Fp8State::kInput),
                    operand(qw, w, Fp8State::kWeight), N, OC, IC, bias, false);
}

template <class Backend>
void Fp8Linear<Backend>::backward(int layer, int gemm, Act* dinp, float* dweight, float* dbias,
                                  const Act* dout, const Act* inp, const Act* weight, int N,
                                  int IC, int OC) {
  const int x = state_.tensor(layer, gemm, Fp8State::kInput);
  const int w = state_.tensor(layer, gemm, Fp8State::kWeight);
  const int g = state_.tensor(layer, gemm, Fp8State::kGrad);
  const Act* no_bias = nullptr;
  cast(grad_, grad_t_, dout, N, OC, g, Fp8State::kGrad);
  // dinp (N,IC) += g (N,OC) · wᵀᵀ: the weight's transpose (IC,OC) is K-contiguous in OC.
  const uint8_t* qw = weight_codes(layer, gemm, weight, OC, IC);
  if (dinp)
    Backend::fp8_gemm(dinp, operand(grad_, g, Fp8State::kGrad),
                      operand(qw + size_t(OC) * IC, w, Fp8State::kWeight), N, IC, OC, no_bias,
                      true);
  // dweight (OC,IC) += gᵀ (OC,N) · xᵀ (IC,N)ᵀ, both K-contiguous in N; the forward's input at
  // its scale again, transposed.
  cast(nullptr, input_, inp, N, IC, x, Fp8State::kInput);
  Backend::fp8_gemm(dweight, operand(grad_t_, g, Fp8State::kGrad),
                    operand(input_, x, Fp8State::kInput), OC, IC, N, no_bias, true);
  if (dbias) Backend::bias_backward(dbias, dout, N, OC);
}

template <class Backend>
void Fp8Linear<Backend>::collect() {
  std::vector<float> amax(size_t(state_.tensors()));
  Backend::to_host(amax.data(), amax_, amax.size() * sizeof(float));
  for (size_t i = 0; i < amax.size(); ++i) state_.observe(int(i), amax[i]);
  Backend::zero(amax_, amax.size() * sizeof(float));
}

template class Fp8Linear<CpuBackend>;
template Fp8Linear<DeclareBackend<float>>::Fp8Linear(const Fp8Options&, int, int, bool, Comm*,
                                                     Comm*, const Fp8Sizes&, Arena&);
template Fp8Linear<DeclareBackend<Bf16Bytes>>::Fp8Linear(const Fp8Options&, int, int, bool, Comm*,
                                                         Comm*, const Fp8Sizes&, Arena&);
#ifdef TESSERA_CUDA
template class Fp8Linear<CudaBackend<float>>;
template class Fp8Linear<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
