#include "model/moe_layer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "backend/op_clock.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
MoeLayer<Backend>::MoeLayer(const ModelShape& shape, const BlockWidths& width,
                            const MoeOptions& options, std::vector<int> layers, int slots,
                            int max_n, Comm* tp, Comm* cp, Comm* ep, Arena& arena,
                            Comm* rows_tp)
    : shape_(shape), width_(width), options_(options), mlp_(family(shape.arch).mlp),
      layers_(std::move(layers)), slots_(slots), max_n_(max_n), tp_(tp), cp_(cp), ep_(ep),
      rows_tp_(rows_tp), ep_size_(ep != nullptr ? ep->size() : 1), arena_(&arena) {
  options_.routing.experts = shape.moe.experts;
  options_.routing.top_k = shape.moe.top_k;
  const size_t N = size_t(max_n), E = size_t(shape.moe.experts), k = size_t(shape.moe.top_k);
  const size_t C = size_t(shape.n_embd), F = size_t(width.ef), FC1 = size_t(width.efc1);
  // R: the rows this rank routes; Rin: the most its held experts compute (rows_in()).
  const size_t R = N * k, Rin = rows_in(), exchange = ep_size_ > 1 ? Rin : 0;
  act_per_ = N * E + 2 * R * C + 2 * exchange * C + Rin * (FC1 + F);
  float_per_ = N * E + N * k;
  int_per_ = N * k + R + N * k + 2 * exchange;
  const size_t n = size_t(slots) * layers_.size();
  h_act_ = arena.add("experts' activations", n * act_per_ * sizeof(Act));
  h_float_ = arena.add("router scores and gates", n * float_per_ * sizeof(float));
  h_int_ = arena.add("dispatch maps", n * int_per_ * sizeof(int32_t));
  // Scratch: the gradients of the rows sent and returned, of the activation and fc1's output,
  // of the logits; with ep two exchange buffers of the rows received.
  h_scratch_ = arena.add("experts' scratch",
                         (2 * R * C + Rin * (F + FC1) + N * E + 2 * exchange * C) * sizeof(Act));
  h_fscratch_ = arena.add("router scratch", (N * k + E) * sizeof(float));
  h_stats_ = arena.add("router statistics", (2 * E + 2) * sizeof(double));
  plans_.resize(n);
  exchanges_.resize(n);
  loads_.assign(n, std::vector<double>(E + 1, 0.0));
  host_choice_.resize(N * k);
  host_stats_.resize(2 * E + 2);
  stats_.resize(layers_.size());
  if (options_.bias_rate > 0) {
    h_bias_ = arena.add("router selection bias (fp32)", layers_.size() * E * sizeof(float));
    host_bias_.assign(layers_.size() * E, 0.0f);
    step_loads_.assign(layers_.size() * E, 0.0);
  }
}

template <class Backend>
void MoeLayer<Backend>::bind(Fp8Linear<Backend>* fp8) {
  fp8_ = fp8;
  acts_ = arena_->get<Act>(h_act_);
  floats_ = arena_->get<float>(h_float_);
  ints_ = arena_->get<int32_t>(h_int_);
  scratch_ = arena_->get<Act>(h_scratch_);
  fscratch_ = arena_->get<float>(h_fscratch_);
  router_stats_ = arena_->get<double>(h_stats_);
  if (options_.bias_rate > 0) {
    bias_ = arena_->get<float>(h_bias_);
    set_bias(host_bias_);
  }
}

template <class Backend>
void MoeLayer<Backend>::set_bias(const std::vector<float>& bias) {
  if (bias.size() != host_bias_.size())
    throw std::logic_error("moe: a bias of " + std::to_string(bias.size()) + " values for " +
                           std::to_string(host_bias_.size()));
  host_bias_ = bias;
  if (bias_ != nullptr) Backend::to_device(bias_, host_bias_.data(), bias.size() * sizeof(float));
}

template <class Backend>
void MoeLayer<Backend>::move_bias() {
  const std::vector<double>& loads = step_loads_;
  const size_t E = size_t(shape_.moe.experts);
  const float rate = float(options_.bias_rate);
  for (size_t i = 0; i < layers_.size(); ++i) {
    double mean = 0;
    for (size_t e = 0; e < E; ++e) mean += loads[i * E + e];
    mean /= double(E);
    // Integer counts (times a common factor): the comparison is exact on every rank.
    for (size_t e = 0; e < E; ++e) {
      const double load = loads[i * E + e];
      host_bias_[i * E + e] += load < mean ? rate : load > mean ? -rate : 0.0f;
    }
  }
  set_bias(host_bias_);
}

template <class Backend>
int MoeLayer<Backend>::row_split() const {
  return (cp_ != nullptr ? cp_->size() : 1) * (rows_tp_ != nullptr ? rows_tp_->size() : 1);
}

template <class Backend>
size_t MoeLayer<Backend>::activation_bytes() const {
  return arena_->bytes(h_act_) + arena_->bytes(h_float_) + arena_->bytes(h_int_);
}

template <class Backend>
size_t MoeLayer<Backend>::rows_in() const {
  const size_t R = size_t(max_n_) * size_t(shape_.moe.top_k);
  if (ep_size_ == 1) return R;
  // From each ep rank (this one too) at most its routed rows, and at most each held expert's
  // capacity: with a capacity factor c that bounds the whole at c k N, not ep k N.
  const size_t cap = size_t(moe_capacity(options_.capacity_factor, max_n_, shape_.moe.top_k,
                                         shape_.moe.experts));
  return size_t(ep_size_) * std::min(R, size_t(held()) * cap);
}

template <class Backend>
int MoeLayer<Backend>::index_of(int layer) const {
  const auto it = std::find(layers_.begin(), layers_.end(), layer);
  return it == layers_.end() ? -1 : int(it - layers_.begin());
}

template <class Backend>
typename MoeLayer<Backend>::Kept MoeLayer<Backend>::kept(int layer, int slot) const {
  const size_t i = at(layer, slot);
  const size_t N = size_t(max_n_), E = size_t(shape_.moe.experts), k = size_t(shape_.moe.top_k);
  const size_t R = N * k, C = size_t(shape_.n_embd), Rin = rows_in();
  const bool exchange = ep_size_ > 1;
  Kept p;
  p.logits = acts_ + i * act_per_;
  p.xs = p.logits + N * E;
  p.y = p.xs + R * C;
  p.xe = exchange ? p.y + R * C : p.xs;
  p.ye = exchange ? p.xe + Rin * C : p.y;
  p.h = (exchange ? p.ye + Rin * C : p.y + R * C);
  p.a = p.h + Rin * size_t(width_.efc1);
  p.scores = floats_ + i * float_per_;
  p.gates = p.scores + N * E;
  p.choice = ints_ + i * int_per_;
  p.token_of = p.choice + N * k;
  p.slot_of = p.token_of + R;
  p.to_expert = exchange ? p.slot_of + N * k : nullptr;
  p.to_source = exchange ? p.to_expert + Rin : nullptr;
  return p;
}

template <class Backend>
typename MoeLayer<Backend>::Act* MoeLayer<Backend>::exchange_scratch() const {
  // After the rows' gradients (sent and returned), the activation's and fc1's, the logits'.
  const size_t R = size_t(max_n_) * size_t(shape_.moe.top_k), Rin = rows_in();
  return scratch_ + 2 * R * size_t(shape_.n_embd) + Rin * size_t(width_.ef + width_.efc1) +
         size_t(max_n_) * size_t(shape_.moe.experts);
}

template <class Backend>
void MoeLayer<Backend>::plan_exchange(const MoeDispatch& d, const Kept& p, Exchange* x) {
  const int P = ep_size_, El = held();
  // Rank r holds experts [r El, (r + 1) El): the plan's counts are already in that order.
  std::vector<int> got(size_t(P) * El);
  ep_->all_to_all_counts(d.counts.data(), got.data(), El);
  x->send_rows.assign(size_t(P), 0);
  x->recv_rows.assign(size_t(P), 0);
  x->counts.assign(size_t(El), 0);
  for (int r = 0; r < P; ++r)
    for (int e = 0; e < El; ++e) {
      x->send_rows[size_t(r)] += d.counts[size_t(r * El + e)];
      x->recv_rows[size_t(r)] += got[size_t(r * El + e)];
      x->counts[size_t(e)] += got[size_t(r * El + e)];
    }
  x->offsets.assign(size_t(El) + 1, 0);
  for (int e = 0; e < El; ++e) x->offsets[size_t(e) + 1] = x->offsets[size_t(e)] + x->counts[size_t(e)];
  // Received rows come by source rank, each source's by expert; the experts read them by expert,
  // each expert's by source rank.
  const int rows = x->offsets[size_t(El)];
  if (size_t(rows) > rows_in())
    throw std::logic_error("moe: " + std::to_string(rows) + " rows received for buffers of " +
                           std::to_string(rows_in()));
  std::vector<int32_t> to_expert(static_cast<size_t>(rows)), to_source(static_cast<size_t>(rows));
  std::vector<int> source_at(size_t(P) + 1, 0);
  for (int r = 0; r < P; ++r) source_at[size_t(r) + 1] = source_at[size_t(r)] + x->recv_rows[size_t(r)];
  int row = 0;
  for (int e = 0; e < El; ++e)
    for (int r = 0; r < P; ++r) {
      int within = source_at[size_t(r)];
      for (int f = 0; f < e; ++f) within += got[size_t(r * El + f)];
      for (int j = 0; j < got[size_t(r * El + e)]; ++j, ++row) {
        to_expert[size_t(row)] = within + j;
        to_source[size_t(within + j)] = row;
      }
    }
  Backend::to_device(p.to_expert, to_expert.data(), size_t(rows) * sizeof(int32_t));
  Backend::to_device(p.to_source, to_source.data(), size_t(rows) * sizeof(int32_t));
}

template <class Backend>
void MoeLayer<Backend>::experts_forward(int layer, int gemm, Act* out, const Act* in,
                                        const Act* weight, const Act* bias,
                                        const std::vector<int>& counts,
                                        const std::vector<int>& offsets, int IC, int OC) {
  if (!fp8_)
    return Backend::experts_forward(out, in, weight, bias, counts.data(), offsets.data(), held(),
                                    IC, OC);
  for (int e = 0; e < held(); ++e) {
    const int n = counts[size_t(e)];
    const Act* w = weight + size_t(e) * OC * IC;
    if (n == 0) {  // no rows: the weight's amax still goes into its history
      fp8_->expert_weight(layer, gemm, e, w, OC, IC);
      continue;
    }
    const size_t r0 = size_t(offsets[size_t(e)]);
    fp8_->expert_forward(layer, gemm, e, out + r0 * OC, in + r0 * IC, w,
                         bias ? bias + size_t(e) * OC : nullptr, n, IC, OC);
  }
}

template <class Backend>
void MoeLayer<Backend>::experts_backward(int layer, int gemm, Act* din, float* dweight,
                                         float* dbias, const Act* dout, const Act* in,
                                         const Act* weight, const std::vector<int>& counts,
                                         const std::vector<int>& offsets, int IC, int OC) {
  if (!fp8_)
    return Backend::experts_backward(din, dweight, dbias, dout, in, weight, counts.data(),
                                     offsets.data(), held(), IC, OC);
  for (int e = 0; e < held(); ++e) {
    const int n = counts[size_t(e)];
    if (n == 0) continue;
    const size_t r0 = size_t(offsets[size_t(e)]), wt = size_t(e) * OC * IC;
    fp8_->expert_backward(layer, gemm, e, din + r0 * IC, dweight + wt,
                          dbias ? dbias + size_t(e) * OC : nullptr, dout + r0 * OC, in + r0 * IC,
                          weight + wt, n, IC, OC);
  }
}

template <class Backend>
void MoeLayer<Backend>::forward(Act* out, const Act* x, const Params& w, int layer, int slot,
                                int N, bool record, bool accumulate) {
  if (N > max_n_ || slot >= slots_ || index_of(layer) < 0)
    throw std::logic_error("moe: layer " + std::to_string(layer) + " slot " + std::to_string(slot) +
                           " of " + std::to_string(slots_) + ", " + std::to_string(N) +
                           " tokens of at most " + std::to_string(max_n_));
  const int E = shape_.moe.experts, k = shape_.moe.top_k, C = shape_.n_embd;
  const int F = width_.ef, FC1 = width_.efc1;
  const Kept p = kept(layer, slot);
  // The router's GEMM with the routing (the breakdown's moe_routing), the experts' their own.
  op_clock::set_gemm(op_clock::kRouting);
  Backend::matmul_forward(p.logits, x, w.router, static_cast<const Act*>(nullptr), N, C, E);
  Backend::moe_route_forward(p.choice, p.gates, p.scores, p.logits,
                             bias_ ? bias_ + size_t(index_of(layer)) * E : nullptr, N,
                             options_.routing);
  Backend::to_host(host_choice_.data(), p.choice, size_t(N) * k * sizeof(int32_t));
  MoeDispatch& d = plans_[at(layer, slot)];
  d = plan_dispatch(host_choice_.data(), N, k, E,
                    moe_capacity(options_.capacity_factor, N, k, E));
  const int rows = d.offsets[size_t(E)];
  Backend::to_device(p.token_of, d.token_of.data(), size_t(rows) * sizeof(int32_t));
  Backend::to_device(p.slot_of, d.slot_of.data(), size_t(N) * k * sizeof(int32_t));
  Backend::moe_gather_rows(p.xs, x, p.token_of, rows, C);
  // The held experts' rows: this rank's own (one ep rank), or every ep rank's for them.
  const std::vector<int>* counts = &d.counts;
  const std::vector<int>* offsets = &d.offsets;
  Act* ex = exchange_scratch();
  if (ep_size_ > 1) {
    Exchange& xc = exchanges_[at(layer, slot)];
    plan_exchange(d, p, &xc);
    ep_->all_to_all_rows(p.xs, xc.send_rows.data(), ex, xc.recv_rows.data(), size_t(C));
    Backend::moe_gather_rows(p.xe, ex, p.to_expert, xc.offsets.back(), C);
    counts = &xc.counts;
    offsets = &xc.offsets;
  }
  // Each held expert on its block of rows (its fc1 rows, its fc2 rows in the local tensors):
  // every fc1, the activation over all the rows, then every fc2 (FP8 scales each GEMM's rows as
  // one).
  const bool bias_here = tp_ == nullptr || tp_->rank() == 0;
  const int rows_e = offsets->back();
  op_clock::set_gemm(op_clock::kExperts);
  expert_rows(layer, Fp8State::kFc1, Fp8State::kInput, p.xe, size_t(rows_e) * C);
  experts_forward(layer, Fp8State::kFc1, p.h, p.xe, w.fc1, w.fc1_bias, *counts, *offsets, C, FC1);
  switch (mlp_) {
    case MlpKind::Gelu: Backend::gelu_forward(p.a, p.h, size_t(rows_e) * F); break;
    case MlpKind::SwiGlu: Backend::swiglu_forward(p.a, p.h, rows_e, F); break;
  }
  expert_rows(layer, Fp8State::kFc2, Fp8State::kInput, p.a, size_t(rows_e) * F);
  experts_forward(layer, Fp8State::kFc2, p.ye, p.a, w.fc2, bias_here ? w.fc2_bias : nullptr,
                  *counts, *offsets, F, C);
  if (ep_size_ > 1) {
    const Exchange& xc = exchanges_[at(layer, slot)];
    Backend::moe_gather_rows(ex, p.ye, p.to_source, xc.offsets.back(), C);
    ep_->all_to_all_rows(ex, xc.recv_rows.data(), p.y, xc.send_rows.data(), size_t(C));
  }
  Backend::moe_combine(out, p.y, p.slot_of, p.gates, N, k, C, accumulate);

  // The balancing losses' sums over the micro-batch (all its cp ranks): Σ_t p[t,e], Σ_t lse²,
  // each expert's load, the dropped choices.
  Backend::moe_router_stats(router_stats_, p.logits, p.scores, N, options_.routing);
  std::vector<double>& load = loads_[at(layer, slot)];
  for (int e = 0; e < E; ++e) load[size_t(e)] = d.routed[size_t(e)];
  load[size_t(E)] = double(d.dropped);
  Backend::to_device(router_stats_ + E + 1, load.data(), (size_t(E) + 1) * sizeof(double));
  const int Ntot = N * row_split();
  if (cp_ != nullptr && cp_->size() > 1) cp_->all_reduce_sum(router_stats_, 2 * size_t(E) + 2);
  if (rows_tp_ != nullptr && rows_tp_->size() > 1)
    rows_tp_->all_reduce_sum(router_stats_, 2 * size_t(E) + 2);
  Backend::to_host(host_stats_.data(), router_stats_, (2 * size_t(E) + 2) * sizeof(double));
  for (int e = 0; e <= E; ++e) load[size_t(e)] = host_stats_[size_t(E + 1 + e)];
  if (!record) return;
  if (!step_loads_.empty()) {
    double* step = step_loads_.data() + size_t(index_of(layer)) * size_t(E);
    for (int e = 0; e < E; ++e) step[e] += load[size_t(e)];
  }
  MoeLayerStats& s = stats_[size_t(index_of(layer))];
  double dot = 0, most = 0;
  for (int e = 0; e < E; ++e) {
    dot += host_stats_[size_t(e)] * load[size_t(e)];
    most = std::max(most, load[size_t(e)]);
  }
  s.aux_loss += options_.aux_loss * E / (double(k) * Ntot * Ntot) * dot;
  s.z_loss += options_.z_loss / Ntot * host_stats_[size_t(E)];
  s.max_load += most;
  s.mean_load += double(Ntot) * k / E;
  s.dropped += int64_t(load[size_t(E)]);
}

template <class Backend>
void MoeLayer<Backend>::backward(Act* dx, const Act* dout, const Act* x, const Params& w,
                                 int layer, int slot, int N, double weight) {
  const int E = shape_.moe.experts, k = shape_.moe.top_k, C = shape_.n_embd;
  const int F = width_.ef, FC1 = width_.efc1;
  const Kept p = kept(layer, slot);
  const MoeDispatch& d = plans_[at(layer, slot)];
  const size_t R = size_t(max_n_) * k, Rin = rows_in();
  Act* drows = scratch_;
  Act* dxs = drows + R * C;
  Act* da = dxs + R * C;
  Act* dh = da + Rin * F;
  Act* dlogits = dh + Rin * FC1;
  Act* ex = exchange_scratch();  // ep > 1: the exchange's two buffers
  Act* ex2 = ex + Rin * C;
  float* dgates = fscratch_;
  float* aux = dgates + size_t(max_n_) * k;
  // The gates' gradient reads the whole expert output: its partial dots summed over tp.
  Backend::moe_combine_backward(drows, dgates, dout, p.y, p.slot_of, p.gates, N, k, C);
  if (tp_ != nullptr && tp_->size() > 1) tp_->all_reduce_sum(dgates, size_t(N) * k);
  // The held experts' rows' output gradients (dye) and input gradients (dxe).
  const std::vector<int>* counts = &d.counts;
  const std::vector<int>* offsets = &d.offsets;
  const Act* dye = drows;
  Act* dxe = dxs;
  const Exchange* xc = ep_size_ > 1 ? &exchanges_[at(layer, slot)] : nullptr;
  if (xc) {
    ep_->all_to_all_rows(drows, xc->send_rows.data(), ex, xc->recv_rows.data(), size_t(C));
    Backend::moe_gather_rows(ex2, ex, p.to_expert, xc->offsets.back(), C);
    dye = ex2;
    dxe = ex;
    counts = &xc->counts;
    offsets = &xc->offsets;
  }
  const int rows = offsets->back();
  Backend::zero(da, size_t(rows) * F * sizeof(Act));
  Backend::zero(dh, size_t(rows) * FC1 * sizeof(Act));
  Backend::zero(dxe, size_t(rows) * C * sizeof(Act));
  // Every fc2, the activation's backward over all the rows, then every fc1 (FP8 scales each
  // GEMM's rows as one).
  op_clock::set_gemm(op_clock::kExperts);
  expert_rows(layer, Fp8State::kFc2, Fp8State::kGrad, dye, size_t(rows) * C);
  expert_rows(layer, Fp8State::kFc2, Fp8State::kInput, p.a, size_t(rows) * F);
  experts_backward(layer, Fp8State::kFc2, da, w.dfc2, w.dfc2_bias, dye, p.a, w.fc2, *counts,
                   *offsets, F, C);
  switch (mlp_) {
    case MlpKind::Gelu: Backend::gelu_backward(dh, p.h, da, size_t(rows) * F); break;
    case MlpKind::SwiGlu: Backend::swiglu_backward(dh, p.h, da, rows, F); break;
  }
  expert_rows(layer, Fp8State::kFc1, Fp8State::kGrad, dh, size_t(rows) * FC1);
  expert_rows(layer, Fp8State::kFc1, Fp8State::kInput, p.xe, size_t(rows) * C);
  experts_backward(layer, Fp8State::kFc1, dxe, w.dfc1, w.dfc1_bias, dh, p.xe, w.fc1, *counts,
                   *offsets, C, FC1);
  if (xc) {
    Backend::moe_gather_rows(ex2, dxe, p.to_source, rows, C);
    ep_->all_to_all_rows(ex2, xc->recv_rows.data(), dxs, xc->send_rows.data(), size_t(C));
  }
  // The gather's backward: each token's rows' gradients summed back into its row.
  Backend::moe_combine(dx, dxs, p.slot_of, static_cast<const float*>(nullptr), N, k, C, true);

  // The router: the gates' gradient, the auxiliary loss's dL/dp[t,e] (its loads are constants),
  // the z-loss; its input gradient is whole on every tp rank, so rank 0 alone adds it to the
  // partial sum.
  const std::vector<double>& load = loads_[at(layer, slot)];
  const int Ntot = N * row_split();
  const bool with_aux = options_.aux_loss != 0;
  if (with_aux) {
    std::vector<float> host(size_t(E) * 1);
    const double c = weight * options_.aux_loss * E / (double(k) * Ntot * Ntot);
    for (int e = 0; e < E; ++e) host[size_t(e)] = float(c * load[size_t(e)]);
    Backend::to_device(aux, host.data(), size_t(E) * sizeof(float));
  }
  // The op averages the z-loss over the rows it is given; the micro-batch has Ntot.
  Backend::moe_route_backward(dlogits, dgates, p.logits, p.scores, p.choice,
                              with_aux ? aux : static_cast<const float*>(nullptr),
                              weight * options_.z_loss * N / Ntot, N, options_.routing);
  const bool dx_here = tp_ == nullptr || tp_->rank() == 0;
  op_clock::set_gemm(op_clock::kRouting);
  Backend::matmul_backward(dx_here ? dx : nullptr, w.drouter, static_cast<float*>(nullptr),
                           dlogits, x, w.router, N, C, E);
}

template class MoeLayer<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp): the stage's constructor sizes it.
template MoeLayer<DeclareBackend<float>>::MoeLayer(const ModelShape&, const BlockWidths&,
                                                   const MoeOptions&, std::vector<int>, int, int,
                                                   Comm*, Comm*, Comm*, Arena&, Comm*);
template MoeLayer<DeclareBackend<Bf16Bytes>>::MoeLayer(const ModelShape&, const BlockWidths&,
                                                       const MoeOptions&, std::vector<int>, int,
                                                       int, Comm*, Comm*, Comm*, Arena&, Comm*);
template size_t MoeLayer<DeclareBackend<float>>::activation_bytes() const;
template size_t MoeLayer<DeclareBackend<Bf16Bytes>>::activation_bytes() const;
template size_t MoeLayer<DeclareBackend<float>>::rows_in() const;
template size_t MoeLayer<DeclareBackend<Bf16Bytes>>::rows_in() const;
#ifdef TESSERA_CUDA
template class MoeLayer<CudaBackend<float>>;
template class MoeLayer<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
