#include "model/transformer_block.hpp"

#include <algorithm>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
TransformerBlock<Backend>::TransformerBlock(const LocalLayout& layout, const ModelOptions& options,
                                            Comm* tp, int max_batch, int max_seq)
    : layout_(&layout), family_(&family(layout.canonical.shape.arch)),
      cost_(block_cost(layout.canonical.shape, layout.tp)), options_(options), tp_(tp) {
  const BlockWidths& w = cost_.width;
  const size_t N = size_t(max_batch) * max_seq, C = size_t(n_embd());
  const size_t Nr = N / size_t(seq_split());
  // The attention's (B,NH/tp,T,T) probabilities' gradient (none with fused attention).
  const size_t att =
      options.fused_attention ? 0 : size_t(max_batch) * size_t(w.nh) * max_seq * max_seq;
  const size_t sp = options_.sequence_parallel ? 1 : 0;
  // The MLP's gradients serve the dense MLP and an MoE layer's shared experts: the wider of them.
  const size_t F = size_t(std::max(w.f, w.sf)), FC1 = size_t(std::max(w.fc1, w.sfc1));
  const size_t sizes[kScratchKinds] = {
      Nr * C, N * C, N * size_t(w.qkv), att, N * size_t(w.q), N * FC1, N * F,
      sp * N * C, sp * N * C, sp * N * C, sp * Nr * C};
  for (int k = 0; k < kScratchKinds; ++k) {
    scratch_offset_[k] = scratch_total_;
    scratch_total_ += sizes[k];
  }
}

template <class Backend>
void TransformerBlock<Backend>::bind(Act* scratch, const float* rope,
                                     ContextAttention<Backend>* context, Fp8Linear<Backend>* fp8,
                                     MoeLayer<Backend>* moe) {
  scratch_ = scratch;
  moe_ = moe;
  rope_ = rope;
  context_ = context;
  fp8_ = fp8;
}

template <class Backend>
const typename Backend::Act* TransformerBlock<Backend>::gather_rows(const Act* rows, Act* full,
                                                                    int N) {
  if (!options_.sequence_parallel) return rows;
  tp_->all_gather(rows, full, size_t(N / seq_split()) * n_embd());
  return full;
}

template <class Backend>
typename Backend::Act* TransformerBlock<Backend>::reduce_rows(Act* partial, Act* rows, int N) {
  if (!options_.sequence_parallel) {
    tp_->all_reduce_sum(partial, size_t(N) * n_embd());
    return partial;
  }
  tp_->reduce_scatter_sum(partial, rows, size_t(N / seq_split()) * n_embd());
  return rows;
}

template <class Backend>
typename TransformerBlock<Backend>::Params TransformerBlock<Backend>::params_of(
    const LayerUnits& u, int l) const {
  const LocalLayout& lay = *layout_;
  const int experts = lay.expert_unit(l);
  Params w;
  for (int r = 0; r < kLayerRoles; ++r) {
    const LayerRole role = LayerRole(r);
    const bool has = lay.canonical.has(l, role);
    const bool apart = experts >= 0 && expert_role(role);
    const Act* params = apart ? u.expert_params : u.params;
    float* grads = apart ? u.expert_grads : u.grads;
    const size_t begin = lay.units[size_t(apart ? experts : lay.layer_unit(l))].begin;
    const size_t at = has ? lay.tensors[size_t(lay.layer(l, role))].offset - begin : 0;
    w.p[r] = has ? params + at : nullptr;
    w.g[r] = has && grads != nullptr ? grads + at : nullptr;
  }
  return w;
}

template <class Backend>
void TransformerBlock<Backend>::norm_forward(Act* out, float* mean, float* rstd, const Act* in,
                                             const Act* weight, const Act* bias, int rows) {
  const ModelShape& s = layout_->canonical.shape;
  switch (family_->norm) {
    case NormKind::LayerNorm:
      Backend::layernorm_forward(out, mean, rstd, in, weight, bias, rows, s.n_embd);
      return;
    case NormKind::RmsNorm:
      Backend::rmsnorm_forward(out, rstd, in, weight, rows, s.n_embd, s.norm_eps);
      return;
  }
}

template <class Backend>
void TransformerBlock<Backend>::norm_backward(Act* din, float* dweight, float* dbias,
                                              const Act* dout, const Act* in, const Act* weight,
                                              const float* mean, const float* rstd, int rows) {
  const int C = n_embd();
  switch (family_->norm) {
    case NormKind::LayerNorm:
      Backend::layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, rows, C);
      return;
    case NormKind::RmsNorm:
      Backend::rmsnorm_backward(din, dweight, dout, in, weight, rstd, rows, C);
      return;
  }
}

template <class Backend>
void TransformerBlock<Backend>::attention_core(const Acts& a, int B, int T) {
  const BlockWidths& w = cost_.width;
  if (context_)
    context_->forward(a.atty, a.lse, a.qkv, B, a.doc_start);
  else if (options_.fused_attention)
    Backend::attention_fused_forward(a.atty, a.lse, a.qkv, B, T, w.nh, w.nkv, w.hs, a.doc_start);
  else
    Backend::attention_forward(a.atty, a.att, a.qkv, B, T, w.nh, w.nkv, w.hs, a.doc_start);
}

// N = B*T rows pass the column-parallel GEMMs and the attention; Nr = N / seq_split() rows pass
// the norms, biases and residual adds (all of them without sequence parallelism).
template <class Backend>
void TransformerBlock<Backend>::forward(const LayerUnits& u, int l, const Acts& a, int B, int T) {
  const int C = n_embd(), N = B * T, Nr = N / seq_split();
  const size_t NrC = size_t(Nr) * C;
  const bool sp = options_.sequence_parallel;
  const Params w = params_of({u.params, nullptr, u.expert_params, nullptr}, l);
  if (fp8_) fp8_->use_codes(l, u.params, u.codes);
  norm_forward(a.norm1, a.norm1_mean, a.norm1_rstd, a.in, w.p[kNorm1W], w.p[kNorm1B], Nr);
  Act* partial = sp ? scratch(kPartial) : a.attproj;
  attention_forward(l, partial, gather_rows(a.norm1, scratch(kGather), N), w, a, B, T);
  // The section's partial products summed over tp, then the replicated bias once.
  reduce_rows(partial, a.attproj, N);
  if (w.p[kProjB]) Backend::bias_add(a.attproj, w.p[kProjB], Nr, C);
  Backend::residual_forward(a.res2, a.in, a.attproj, NrC);
  norm_forward(a.norm2, a.norm2_mean, a.norm2_rstd, a.res2, w.p[kNorm2W], w.p[kNorm2B], Nr);
  if (own_rows(l)) {
    // Whole experts (parallel.expert_tp = 1): this rank's own rows in, their whole output out.
    moe_->forward(a.fc2, a.norm2, moe_params(w), l, a.slot, Nr, !a.recomputing);
  } else {
    partial = sp ? scratch(kPartial) : a.fc2;
    mlp_forward(l, partial, gather_rows(a.norm2, scratch(kGather), N), w, a, N);
    reduce_rows(partial, a.fc2, N);
  }
  if (w.p[kFc2B]) Backend::bias_add(a.fc2, w.p[kFc2B], Nr, C);
  Backend::residual_forward(a.out, a.res2, a.fc2, NrC);
}

// x (N,C): the first norm's output, all rows. Column-parallel q, k, v (this rank's heads of
// each), model.qk_norm's per-head norm and rotary positions on q and k, the core, the
// row-parallel output projection into out.
template <class Backend>
void TransformerBlock<Backend>::attention_forward(int l, Act* out, const Act* x, const Params& w,
                                                  const Acts& a, int B, int T) {
  const BlockWidths& wd = cost_.width;
  const int N = B * T;
  const Act* none = nullptr;
  linear_forward(l, Fp8State::kQkv, a.qkv, x, w.p[kQkvW], w.p[kQkvB], N);
  if (w.p[kQkNormW])
    Backend::qk_norm_forward(a.qkv, a.qk_raw, a.qk_rstd, w.p[kQkNormW], N, wd.nh, wd.nkv, wd.hs,
                             layout_->canonical.shape.norm_eps);
  if (family_->position == Positions::Rotary)
    Backend::rope_forward(a.qkv, rope_, B, T, wd.nh, wd.nkv, wd.hs);
  attention_core(a, B, T);
  linear_forward(l, Fp8State::kProj, out, a.atty, w.p[kProjW], none, N);
}

// x (N,C): the second norm's output, all rows. fc1 (column-parallel), the activation, fc2
// (row-parallel) into out. (A mixture of experts: route, permute, each expert's fc1,
// activation and fc2, unpermute by gate weight.)
template <class Backend>
typename MoeLayer<Backend>::Params TransformerBlock<Backend>::moe_params(const Params& w) const {
  return {w.p[kRouterW], w.p[kExpertFc1W], w.p[kExpertFc1B], w.p[kExpertFc2W], w.p[kExpertFc2B],
          w.g[kRouterW], w.g[kExpertFc1W], w.g[kExpertFc1B], w.g[kExpertFc2W], w.g[kExpertFc2B]};
}

// An MoE layer's shared experts are a dense MLP of their own width (DeepSeek's y = routed(x) +
// shared(x)): computed into out first, the routed experts' output then added to it, so their
// sum leaves through the section's one reduction (fc2's bias, the shared experts', after it).
template <class Backend>
void TransformerBlock<Backend>::mlp_forward(int l, Act* out, const Act* x, const Params& w,
                                            const Acts& a, int N) {
  const bool routed = moe_ && moe_->routed(l);
  const int F = routed ? cost_.width.sf : cost_.width.f;
  const int FC1 = routed ? cost_.width.sfc1 : cost_.width.fc1;
  const int C = n_embd();
  const Act* none = nullptr;
  if (F > 0) {
    linear_forward(l, Fp8State::kFc1, a.fc1, x, w.p[kFc1W], w.p[kFc1B], N, C, FC1);
    switch (family_->mlp) {
      case MlpKind::Gelu: Backend::gelu_forward(a.mlp_act, a.fc1, size_t(N) * F); break;
      case MlpKind::SwiGlu: Backend::swiglu_forward(a.mlp_act, a.fc1, N, F); break;
    }
    linear_forward(l, Fp8State::kFc2, out, a.mlp_act, w.p[kFc2W], none, N, F, C);
  }
  if (routed) moe_->forward(out, x, moe_params(w), l, a.slot, N, !a.recomputing, F > 0);
}

template <class Backend>
void TransformerBlock<Backend>::backward(const LayerUnits& u, int l, const Acts& a, int B,
                                         int T) {
  const int N = B * T, Nr = N / seq_split();
  const Params w = params_of(u, l);
  if (fp8_) fp8_->use_codes(l, u.params, u.codes);
  // dres holds the gradient of the layer's output (this rank's rows); the residual path passes
  // it through unchanged, so each section's backward only adds its input gradient into it. The
  // row-parallel GEMMs read it whole (all-gathered), and the column-parallel GEMMs' input
  // gradients are partial sums over tp (kDNorm), reduced back into this rank's rows.
  Act* dres = scratch(kDRes);
  const Act* dnorm2 = scratch(kDNormRows);
  if (own_rows(l)) {  // whole experts: this rank's rows' gradients are whole
    zero(scratch(kDNormRows), size_t(Nr) * n_embd());
    moe_->backward(scratch(kDNormRows), dres, a.norm2, moe_params(w), l, a.slot, Nr, loss_weight_);
  } else {
    mlp_backward(l, w, a, N);
    dnorm2 = reduce_rows(scratch(kDNorm), scratch(kDNormRows), N);
  }
  norm_backward(dres, w.g[kNorm2W], w.g[kNorm2B], dnorm2, a.res2, w.p[kNorm2W], a.norm2_mean,
                a.norm2_rstd, Nr);
  attention_backward(l, w, a, B, T);
  const Act* dnorm1 = reduce_rows(scratch(kDNorm), scratch(kDNormRows), N);
  norm_backward(dres, w.g[kNorm1W], w.g[kNorm1B], dnorm1, a.in, w.p[kNorm1W], a.norm1_mean,
                a.norm1_rstd, Nr);
}

// Both parts of an MoE layer with shared experts read the same output gradient and add their
// input gradients into kDNorm.
template <class Backend>
void TransformerBlock<Backend>::mlp_backward(int l, const Params& w, const Acts& a, int N) {
  const bool routed = moe_ && moe_->routed(l);
  const int F = routed ? cost_.width.sf : cost_.width.f;
  const int FC1 = routed ? cost_.width.sfc1 : cost_.width.fc1;
  const int C = n_embd();
  zero(scratch(kDNorm), size_t(N) * C);
  const Act* dout = gather_rows(scratch(kDRes), scratch(kDFull), N);
  const Act* x = gather_rows(a.norm2, scratch(kGather), N);
  if (routed) moe_->backward(scratch(kDNorm), dout, x, moe_params(w), l, a.slot, N, loss_weight_);
  if (F == 0) return;
  zero(scratch(kDMlpAct), size_t(N) * F);
  linear_backward(l, Fp8State::kFc2, scratch(kDMlpAct), w.g[kFc2W], w.g[kFc2B], dout, a.mlp_act,
                  w.p[kFc2W], N, F, C);
  zero(scratch(kDFc1), size_t(N) * FC1);
  switch (family_->mlp) {
    case MlpKind::Gelu:
      Backend::gelu_backward(scratch(kDFc1), a.fc1, scratch(kDMlpAct), size_t(N) * F);
      break;
    case MlpKind::SwiGlu:
      Backend::swiglu_backward(scratch(kDFc1), a.fc1, scratch(kDMlpAct), N, F);
      break;
  }
  linear_backward(l, Fp8State::kFc1, scratch(kDNorm), w.g[kFc1W], w.g[kFc1B], scratch(kDFc1), x,
                  w.p[kFc1W], N, C, FC1);
}

template <class Backend>
void TransformerBlock<Backend>::attention_backward(int l, const Params& w, const Acts& a, int B,
                                                   int T) {
  const BlockWidths& wd = cost_.width;
  const int C = n_embd(), N = B * T;
  zero(scratch(kDAttY), size_t(N) * wd.q);
  linear_backward(l, Fp8State::kProj, scratch(kDAttY), w.g[kProjW], w.g[kProjB],
                  gather_rows(scratch(kDRes), scratch(kDFull), N), a.atty, w.p[kProjW], N);
  zero(scratch(kDQkv), size_t(N) * wd.qkv);
  if (context_)
    context_->backward(scratch(kDQkv), scratch(kDAttY), a.qkv, a.atty, a.lse, B, a.doc_start);
  else if (options_.fused_attention)
    Backend::attention_fused_backward(scratch(kDQkv), scratch(kDAttY), a.qkv, a.atty, a.lse, B, T,
                                      wd.nh, wd.nkv, wd.hs, a.doc_start);
  else
    Backend::attention_backward(scratch(kDQkv), scratch(kDAtt), scratch(kDAttY), a.qkv, a.att, B,
                                T, wd.nh, wd.nkv, wd.hs);
  if (family_->position == Positions::Rotary)
    Backend::rope_backward(scratch(kDQkv), rope_, B, T, wd.nh, wd.nkv, wd.hs);
  if (w.p[kQkNormW])
    Backend::qk_norm_backward(scratch(kDQkv), w.g[kQkNormW], a.qk_raw, w.p[kQkNormW], a.qk_rstd,
                              N, wd.nh, wd.nkv, wd.hs);
  zero(scratch(kDNorm), size_t(N) * C);
  linear_backward(l, Fp8State::kQkv, scratch(kDNorm), w.g[kQkvW], w.g[kQkvB], scratch(kDQkv),
                  gather_rows(a.norm1, scratch(kGather), N), w.p[kQkvW], N);
}

template class TransformerBlock<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp): the stage's constructor sizes it.
template TransformerBlock<DeclareBackend<float>>::TransformerBlock(const LocalLayout&,
                                                                   const ModelOptions&, Comm*,
                                                                   int, int);
template TransformerBlock<DeclareBackend<Bf16Bytes>>::TransformerBlock(const LocalLayout&,
                                                                       const ModelOptions&, Comm*,
                                                                       int, int);
#ifdef TESSERA_CUDA
template class TransformerBlock<CudaBackend<float>>;
template class TransformerBlock<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
