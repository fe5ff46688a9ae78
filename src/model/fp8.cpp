#include "model/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "common/error.hpp"
#include "parallel/comm.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

Fp8State::Fp8State(const Fp8Options& options, int begin, int end, bool head,
                   std::vector<int> moe, int experts)
    : options_(options), begin_(begin), end_(end), head_(head), moe_(std::move(moe)),
      experts_(moe_.empty() ? 0 : experts) {
  experts_at_ = (end - begin) * kPerLayer + (head ? kRoles : 0);
  const size_t n = size_t(experts_at_) + moe_.size() * size_t(expert_rows());
  history_.assign(n * size_t(H()), -1.0f);
  pending_.assign(n, 0.0f);
}

int Fp8State::tensor(int layer, int gemm, Role role) const {
  return first(layer) + gemm * kRoles + role;
}

int Fp8State::first_expert(int layer) const {
  const auto it = std::find(moe_.begin(), moe_.end(), layer);
  if (it == moe_.end())
    throw std::logic_error("fp8: layer " + std::to_string(layer) + " has no experts in this state");
  return experts_at_ + int(it - moe_.begin()) * expert_rows();
}

int Fp8State::expert_tensor(int layer, int gemm, Role role, int expert) const {
  const int at = first_expert(layer) + (gemm == kFc2 ? 2 + experts_ : 0);
  return role == kInput ? at : role == kGrad ? at + 1 : at + 2 + expert;
}

Fp8State::Role Fp8State::role(int i) const {
  if (i < experts_at_) return Role(i % kRoles);
  const int r = (i - experts_at_) % (2 + experts_);
  return r == 0 ? kInput : r == 1 ? kGrad : kWeight;
}

float Fp8State::scale(int i, float current) const {
  const float* h = history_.data() + size_t(i) * H();
  float amax = h[0];
  if (!options_.most_recent)
    for (int k = 1; k < H(); ++k) amax = std::max(amax, h[k]);
  if (amax < 0) amax = current;  // the first step: no history yet
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  const float s = std::ldexp(fp8_max(format(role(i))) / amax, -options_.margin);
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

std::vector<float> Fp8State::history(int layer, bool experts) const {
  const auto at = history_.begin() + long(experts ? first_expert(layer) : first(layer)) * H();
  return {at, at + long(rows(layer, experts)) * H()};
}

void Fp8State::set_history(int layer, const std::vector<float>& h, bool experts) {
  if (h.size() != size_t(rows(layer, experts)) * H())
    throw UserError("fp8 amax history of layer " + std::to_string(layer) +
                    (experts ? "'s experts" : "") + ": " + std::to_string(h.size()) +
                    " values, expected " + std::to_string(size_t(rows(layer, experts)) * H()));
  std::copy(h.begin(), h.end(),
            history_.begin() + long(experts ? first_expert(layer) : first(layer)) * H());
}

template <class Backend>
Fp8Linear<Backend>::Fp8Linear(const Fp8Options& options, int begin, int end, bool head, Comm* tp,
                              Comm* cp, const Fp8Sizes& sizes, Arena& arena,
                              const Fp8Experts& experts)
    : state_(options, begin, end, head, experts.layers, experts.experts), tp_(tp), cp_(cp),
      arena_(&arena), experts_(experts) {
  // Each place's codes, then their transpose: 2 bytes per element. Starts 16-byte aligned
  // (cuBLASLt's FP8 operands). A place per weight, or under layer_codes two layers' and the head's;
  // then the held experts' fc1 and fc2 of each MoE layer (under layer_codes two MoE layers').
  const int layers = options.layer_codes ? std::min(2, end - begin) : end - begin;
  const int places = layers * Fp8State::kGemms + (head ? 1 : 0);
  const int moe = int(experts.layers.size());
  const int moe_places = (options.layer_codes ? std::min(2, moe) : moe) * 2 * experts.held;
  expert_places_ = size_t(places);
  weight_at_.assign(size_t(places + moe_places), 0);
  cast_.assign(weight_at_.size(), Cast{});
  part_scale_.assign(size_t(state_.tensors()), 1.0f);
  size_t total = 0;
  for (int w = 0; w < places + moe_places; ++w) {
    const bool is_head = head && w == places - 1;
    weight_at_[size_t(w)] = total;
    const size_t n = w >= places    ? ((w - places) % 2 == 0 ? experts.fc1 : experts.fc2)
                     : is_head      ? sizes.head
                                    : sizes.weight[w % Fp8State::kGemms];
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
  // cast, in this step only. (An expert's weight, reduced over tp alone: the cp and ep ranks may
  // hold other experts. The experts' GEMMs run on codes only with histories: experts_fp8.)
  if (state_.has_history(tensor)) return state_.scale(tensor, 0.0f);
  const bool expert = tensor >= state_.expert_tensor_begin();
  return state_.scale(tensor, tile_amax(Backend::fp8_amax(x, n), nullptr, !expert));
}

template <class Backend>
float Fp8Linear<Backend>::tile_amax(float amax, Comm* shard, bool cp) {
  if (std::isnan(amax)) amax = INFINITY;  // MPI's max of a NaN is unspecified; judged at the end
  if (shard != nullptr) host_all_reduce_max(shard->mpi(), &amax, 1);
  host_all_reduce_max(tp_->mpi(), &amax, 1);
  if (cp && cp_ != nullptr) host_all_reduce_max(cp_->mpi(), &amax, 1);
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
  const size_t at = place(layer, gemm, tensor / Fp8State::kRoles);
  if (codes_ != nullptr && layer == codes_layer_) {
    uint8_t* codes = weights_ + weight_at_[at];
    Cast& c = cast_[at];
    if (c.weight != tensor || c.generation != state_.generation() || c.rows != OC || c.cols != IC) {
      Backend::fp8_place(codes, codes + size_t(OC) * IC, codes_ + (weight - codes_params_), OC, IC,
                         1.0f / part_scale_[size_t(tensor)], scale_inv(tensor));
      c = {tensor, state_.generation(), OC, IC};
    }
    return codes;
  }
  return cast_weight(at, tensor, weight, OC, IC);
}

template <class Backend>
uint8_t* Fp8Linear<Backend>::cast_weight(size_t at, int tensor, const Act* weight, int OC, int IC) {
  uint8_t* codes = weights_ + weight_at_[at];
  Cast& c = cast_[at];
  if (c.weight != tensor || c.generation != state_.generation() || c.rows != OC || c.cols != IC) {
    cast(codes, codes + size_t(OC) * IC, weight, OC, IC, tensor, Fp8State::kWeight);
    c = {tensor, state_.generation(), OC, IC};
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
  if (layer == Fp8State::kHead) return expert_places_ - 1;
  return size_t((layer - state_.begin()) % 2) * Fp8State::kGemms + size_t(gemm);
}

template <class Backend>
size_t Fp8Linear<Backend>::expert_place(int layer, int gemm, int expert) const {
  const std::vector<int>& moe = state_.moe();
  size_t m = size_t(std::find(moe.begin(), moe.end(), layer) - moe.begin());
  if (state_.options().layer_codes) m %= 2;
  return expert_places_ + (m * size_t(experts_.held) + size_t(expert)) * 2 +
         (gemm == Fp8State::kFc2 ? 1 : 0);
}

template <class Backend>
void Fp8Linear<Backend>::forward(int layer, int gemm, Act* out, const Act* inp, const Act* weight,
                                 const Act* bias, int N, int IC, int OC) {
  const uint8_t* qw = weight_codes(layer, gemm, weight, OC, IC);
  gemm_forward(state_.tensor(layer, gemm, Fp8State::kInput),
               state_.tensor(layer, gemm, Fp8State::kWeight), qw, out, inp, bias, N, IC, OC);
}

template <class Backend>
void Fp8Linear<Backend>::gemm_forward(int x, int w, const uint8_t* qw, Act* out, const Act* inp,
                                      const Act* bias, int N, int IC, int OC) {
  cast(input_, nullptr, inp, N, IC, x, Fp8State::kInput);
  Backend::fp8_gemm(out, operand(input_, x, Fp8State::kInput),
                    operand(qw, w, Fp8State::kWeight), N, OC, IC, bias, false);
}

template <class Backend>
void Fp8Linear<Backend>::backward(int layer, int gemm, Act* dinp, float* dweight, float* dbias,
                                  const Act* dout, const Act* inp, const Act* weight, int N,
                                  int IC, int OC) {
  const int g = state_.tensor(layer, gemm, Fp8State::kGrad);
  // The output gradient's cast first (a first step's amax reduction before the weight's).
  cast(grad_, grad_t_, dout, N, OC, g, Fp8State::kGrad);
  const uint8_t* qw = weight_codes(layer, gemm, weight, OC, IC);
  gemm_backward(state_.tensor(layer, gemm, Fp8State::kInput),
                state_.tensor(layer, gemm, Fp8State::kWeight), g, qw, dinp, dweight, dbias, dout,
                inp, N, IC, OC);
}

// The output gradient g already cast (grad_, grad_t_).
template <class Backend>
void Fp8Linear<Backend>::gemm_backward(int x, int w, int g, const uint8_t* qw, Act* dinp,
                                       float* dweight, float* dbias, const Act* dout,
                                       const Act* inp, int N, int IC, int OC) {
  const Act* no_bias = nullptr;
  // dinp (N,IC) += g (N,OC) · wᵀᵀ: the weight's transpose (IC,OC) is K-contiguous in OC.
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
bool Fp8Linear<Backend>::experts_fp8(int layer) const {
  return state_.has_history(state_.expert_tensor(layer, Fp8State::kFc1, Fp8State::kInput, 0));
}

template <class Backend>
void Fp8Linear<Backend>::expert_rows(int layer, int gemm, Fp8State::Role role, const Act* x,
                                     size_t n) {
  // A cast folds the amax of codes' rows; a step in the compute type reads it here (host).
  if (!experts_fp8(layer) && n > 0)
    state_.observe(state_.expert_tensor(layer, gemm, role, 0), Backend::fp8_amax(x, n));
}

template <class Backend>
const uint8_t* Fp8Linear<Backend>::expert_weight(int layer, int gemm, int expert,
                                                 const Act* weight, int OC, int IC) {
  const int w = state_.expert_tensor(layer, gemm, Fp8State::kWeight, experts_.first + expert);
  if (experts_fp8(layer)) return cast_weight(expert_place(layer, gemm, expert), w, weight, OC, IC);
  state_.observe(w, Backend::fp8_amax(weight, size_t(OC) * IC));
  return nullptr;
}

template <class Backend>
void Fp8Linear<Backend>::expert_forward(int layer, int gemm, int expert, Act* out, const Act* inp,
                                        const Act* weight, const Act* bias, int N, int IC,
                                        int OC) {
  const int w = state_.expert_tensor(layer, gemm, Fp8State::kWeight, experts_.first + expert);
  const uint8_t* qw = expert_weight(layer, gemm, expert, weight, OC, IC);
  if (!qw) {
    Backend::matmul_forward(out, inp, weight, bias, N, IC, OC);
    return;
  }
  gemm_forward(state_.expert_tensor(layer, gemm, Fp8State::kInput, 0), w, qw, out, inp, bias, N,
               IC, OC);
}

template <class Backend>
void Fp8Linear<Backend>::expert_backward(int layer, int gemm, int expert, Act* dinp,
                                         float* dweight, float* dbias, const Act* dout,
                                         const Act* inp, const Act* weight, int N, int IC,
                                         int OC) {
  const int w = state_.expert_tensor(layer, gemm, Fp8State::kWeight, experts_.first + expert);
  if (!experts_fp8(layer)) {
    Backend::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    return;
  }
  const int g = state_.expert_tensor(layer, gemm, Fp8State::kGrad, 0);
  cast(grad_, grad_t_, dout, N, OC, g, Fp8State::kGrad);
  const uint8_t* qw = cast_weight(expert_place(layer, gemm, expert), w, weight, OC, IC);
  gemm_backward(state_.expert_tensor(layer, gemm, Fp8State::kInput, 0), w, g, qw, dinp, dweight,
                dbias, dout, inp, N, IC, OC);
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
                                                     Comm*, const Fp8Sizes&, Arena&,
                                                     const Fp8Experts&);
template Fp8Linear<DeclareBackend<Bf16Bytes>>::Fp8Linear(const Fp8Options&, int, int, bool, Comm*,
                                                         Comm*, const Fp8Sizes&, Arena&,
                                                         const Fp8Experts&);
#ifdef TESSERA_CUDA
template class Fp8Linear<CudaBackend<float>>;
template class Fp8Linear<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
