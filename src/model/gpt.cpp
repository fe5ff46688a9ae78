#include "model/gpt.hpp"

#include "backend/cpu/backend.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
Gpt<Backend>::Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots,
                  Arena& arena, bool fused_attention)
    : layout_(layout), tp_(tp), arena_(&arena), max_n_(max_batch * max_seq),
      fused_attention_(fused_attention) {
  const ModelShape& s = layout.canonical.shape;
  const size_t N = size_t(max_batch) * max_seq, C = s.n_embd;
  const size_t Cl = C / layout.tp;  // this rank's share of the heads / MLP width, per C
  const size_t L = size_t(layout.layer_end - layout.layer_begin);
  // The attention's (B,NH/tp,T,T) probabilities, or with fused attention each row's log-sum-exp.
  const size_t rows = size_t(max_batch) * (s.n_head / layout.tp) * max_seq;
  const size_t att = fused_attention ? 0 : rows * max_seq, lse = fused_attention ? rows : 0;
  const size_t last = layout.last ? 1 : 0;
  struct { Slot kind; size_t size, count; } plan[] = {
      {kEncoded, N * C, 1},     {kLn1, N * C, L},          {kQkv, 3 * N * Cl, L},
      {kAtt, att, L},           {kAttY, N * Cl, L},        {kAttProj, N * C, L},
      {kRes2, N * C, L},        {kLn2, N * C, L},          {kFcH, 4 * N * Cl, L},
      {kFcGelu, 4 * N * Cl, L}, {kFcProj, N * C, L},       {kRes3, N * C, L},
      {kLnF, N * C, last},      {kLogits, N * size_t(layout.vocab_rows), last},
  };
  for (const auto& p : plan) {
    offset_[p.kind] = slot_stride_;
    size_[p.kind] = p.size;
    slot_stride_ += p.size * p.count;
  }
  struct { Stat kind; size_t size, count; } stat_plan[] = {
      {kLn1Mean, N, L},    {kLn1Rstd, N, L},    {kLn2Mean, N, L}, {kLn2Rstd, N, L},
      {kAttLse, lse, L},   {kLnFMean, N, last}, {kLnFRstd, N, last},
  };
  for (const auto& p : stat_plan) {
    stat_offset_[p.kind] = stat_stride_;
    stat_size_[p.kind] = p.size;
    stat_stride_ += p.size * p.count;
  }
  const size_t scratch_sizes[kScratchKinds] = {N * C, N * C, 3 * N * Cl, att,
                                                N * Cl, 4 * N * Cl, 4 * N * Cl};
  size_t total = 0;
  for (int k = 0; k < kScratchKinds; ++k) {
    scratch_offset_[k] = total;
    total += scratch_sizes[k];
  }
  h_acts_ = arena.add("activations", slot_stride_ * size_t(slots) * sizeof(Act));
  h_stats_ = arena.add("statistics (layernorm, attention log-sum-exp)", stat_stride_ * size_t(slots) * 4);
  h_scratch_ = arena.add("backward scratch", total * sizeof(Act));
  h_row_max_ = arena.add("cross-entropy row max", N * sizeof(float));
  h_sums_ = arena.add("cross-entropy sums", 2 * N * sizeof(double));
  h_targets_ = arena.add("targets", size_t(slots) * N * sizeof(int32_t));
}

template <class Backend>
void Gpt<Backend>::bind() {
  acts_ = arena_->get<Act>(h_acts_);
  stats_ = arena_->get<float>(h_stats_);
  scratch_ = arena_->get<Act>(h_scratch_);
  row_max_ = arena_->get<float>(h_row_max_);
  ce_sums_ = arena_->get<double>(h_sums_);
  targets_ = arena_->get<int32_t>(h_targets_);
}

template <class Backend>
const typename Backend::Act* Gpt<Backend>::output(int slot) const {
  const int L = layout_.layer_end - layout_.layer_begin;
  return L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
}

template <class Backend>
void Gpt<Backend>::forward(const Act* params, int slot, const int32_t* tokens,
                           const int32_t* targets, float* losses, int B, int T) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };
  const Act* none = nullptr;

  if (lay.first) {
    // Vocab-parallel lookup: each rank fills its rows' tokens, tp rank 0 adds the positions once.
    Backend::encoder_forward(act(kEncoded, slot), tokens, P(lay.wte),
                             lay.tp_rank == 0 ? P(lay.wpe) : none, B, T, C, lay.vocab_begin,
                             lay.vocab_rows);
    tp_->all_reduce_sum(act(kEncoded, slot), NC);
  }
  const Act* residual = act(kEncoded, slot);
  for (int l = lay.layer_begin; l < lay.layer_end; ++l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    auto A = [&](Slot k) { return act(k, slot, i); };
    Backend::layernorm_forward(A(kLn1), stat(kLn1Mean, slot, i), stat(kLn1Rstd, slot, i),
                               residual, W(kLn1W), W(kLn1B), N, C);
    // Column-parallel c_attn: this rank's heads of q, k and v.
    Backend::matmul_forward(A(kQkv), A(kLn1), W(kAttnW), W(kAttnB), N, C, 3 * Cl);
    if (fused_attention_)
      Backend::attention_fused_forward(A(kAttY), stat(kAttLse, slot, i), A(kQkv), B, T, NHl, NHl,
                                        Cl / NHl);
    else
      Backend::attention_forward(A(kAttY), A(kAtt), A(kQkv), B, T, NHl, NHl, Cl / NHl);
    // Row-parallel c_proj: partial products summed over tp, then the replicated bias once.
    Backend::matmul_forward(A(kAttProj), A(kAttY), W(kAttnProjW), none, N, Cl, C);
    tp_->all_reduce_sum(A(kAttProj), NC);
    Backend::bias_add(A(kAttProj), W(kAttnProjB), N, C);
    Backend::residual_forward(A(kRes2), residual, A(kAttProj), NC);
    Backend::layernorm_forward(A(kLn2), stat(kLn2Mean, slot, i), stat(kLn2Rstd, slot, i),
                               A(kRes2), W(kLn2W), W(kLn2B), N, C);
    Backend::matmul_forward(A(kFcH), A(kLn2), W(kFcW), W(kFcB), N, C, 4 * Cl);
    Backend::gelu_forward(A(kFcGelu), A(kFcH), size_t(N) * 4 * Cl);
    Backend::matmul_forward(A(kFcProj), A(kFcGelu), W(kFcProjW), none, N, 4 * Cl, C);
    tp_->all_reduce_sum(A(kFcProj), NC);
    Backend::bias_add(A(kFcProj), W(kFcProjB), N, C);
    Backend::residual_forward(A(kRes3), A(kRes2), A(kFcProj), NC);
    residual = A(kRes3);
  }
  if (!lay.last) return;

  Backend::layernorm_forward(act(kLnF, slot), stat(kLnFMean, slot), stat(kLnFRstd, slot),
                             residual, P(lay.ln_f_weight), P(lay.ln_f_bias), N, C);
  // Vocab-parallel tied head over this rank's rows (head_columns(): the real ones, or with the
  // padding where the backend wants aligned GEMMs; the cross-entropy reads the real ones).
  const int Vh = head_columns(), Vl = lay.vocab_valid();
  Act* logits = act(kLogits, slot);
  Backend::matmul_forward(logits, act(kLnF, slot), P(lay.wte), none, N, C, Vh);
  if (targets == nullptr) return;

  // Vocab-parallel cross-entropy: the max, then the sum of exponentials and the target logit,
  // are reduced over tp; full logits never exist on one rank. The backward reads the targets
  // from the slot's own copy.
  int32_t* slot_targets = targets_ + size_t(slot) * max_n_;
  Backend::copy(slot_targets, targets, size_t(N) * sizeof(int32_t));
  Backend::crossentropy_row_max(row_max_, logits, N, Vh, Vl);
  tp_->all_reduce_max(row_max_, size_t(N));
  Backend::crossentropy_exp_sums(ce_sums_, logits, logits, row_max_, slot_targets, N, Vh, Vl,
                                 lay.vocab_begin);
  tp_->all_reduce_sum(ce_sums_, 2 * size_t(N));
  Backend::crossentropy_finish(losses, logits, ce_sums_, N, Vh, Vl);
}

template <class Backend>
void Gpt<Backend>::backward(const Act* params, float* grads, int slot, const int32_t* tokens,
                            int B, int T, float dloss,
                            const std::function<void(int layer)>& layer_done) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };
  auto G = [&](int tensor) { return grads + lay.tensors[size_t(tensor)].offset; };
  const int L = lay.layer_end - lay.layer_begin;
  Act* dres = scratch(kDRes);
  float* const no_grad = nullptr;

  if (lay.last) {
    // The probabilities become their own gradient in place: probs - onehot, scaled (0 on the
    // padding columns, so the padding rows of wte get no gradient).
    const int Vh = head_columns(), Vl = lay.vocab_valid();
    Act* dlogits = act(kLogits, slot);
    Backend::crossentropy_backward(dlogits, dlogits, targets_ + size_t(slot) * max_n_, dloss, N,
                                   Vh, Vl, lay.vocab_begin);
    zero(scratch(kDLn), NC);
    Backend::matmul_backward(scratch(kDLn), G(lay.wte), no_grad, dlogits, act(kLnF, slot),
                             P(lay.wte), N, C, Vh);
    tp_->all_reduce_sum(scratch(kDLn), NC);
    zero(dres, NC);
    const Act* last_out = L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
    Backend::layernorm_backward(dres, G(lay.ln_f_weight), G(lay.ln_f_bias), scratch(kDLn),
                                last_out, P(lay.ln_f_weight), stat(kLnFMean, slot),
                                stat(kLnFRstd, slot), N, C);
  }
  // dres holds the gradient of each layer's output; the residual path passes it through
  // unchanged, so each branch's backward only adds its input gradient into it.
  for (int l = lay.layer_end - 1; l >= lay.layer_begin; --l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    auto GW = [&](LayerTensor t) { return G(lay.layer(l, t)); };
    const Act* residual_in = i == 0 ? act(kEncoded, slot) : act(kRes3, slot, i - 1);

    zero(scratch(kDFcGelu), 4 * size_t(N) * Cl);
    Backend::matmul_backward(scratch(kDFcGelu), GW(kFcProjW), GW(kFcProjB), dres,
                             act(kFcGelu, slot, i), W(kFcProjW), N, 4 * Cl, C);
    zero(scratch(kDFcH), 4 * size_t(N) * Cl);
    Backend::gelu_backward(scratch(kDFcH), act(kFcH, slot, i), scratch(kDFcGelu),
                           4 * size_t(N) * Cl);
    zero(scratch(kDLn), NC);
    Backend::matmul_backward(scratch(kDLn), GW(kFcW), GW(kFcB), scratch(kDFcH),
                             act(kLn2, slot, i), W(kFcW), N, C, 4 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC);  // column-parallel input: partial over tp
    Backend::layernorm_backward(dres, GW(kLn2W), GW(kLn2B), scratch(kDLn), act(kRes2, slot, i),
                                W(kLn2W), stat(kLn2Mean, slot, i), stat(kLn2Rstd, slot, i), N, C);

    zero(scratch(kDAttY), size_t(N) * Cl);
    Backend::matmul_backward(scratch(kDAttY), GW(kAttnProjW), GW(kAttnProjB), dres,
                             act(kAttY, slot, i), W(kAttnProjW), N, Cl, C);
    zero(scratch(kDQkv), 3 * size_t(N) * Cl);
    if (fused_attention_)
      Backend::attention_fused_backward(scratch(kDQkv), scratch(kDAttY), act(kQkv, slot, i),
                                        act(kAttY, slot, i), stat(kAttLse, slot, i), B, T, NHl,
                                        NHl, Cl / NHl);
    else
      Backend::attention_backward(scratch(kDQkv), scratch(kDAtt), scratch(kDAttY),
                                  act(kQkv, slot, i), act(kAtt, slot, i), B, T, NHl, NHl,
                                  Cl / NHl);
    zero(scratch(kDLn), NC);
    Backend::matmul_backward(scratch(kDLn), GW(kAttnW), GW(kAttnB), scratch(kDQkv),
                             act(kLn1, slot, i), W(kAttnW), N, C, 3 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC);
    Backend::layernorm_backward(dres, GW(kLn1W), GW(kLn1B), scratch(kDLn), residual_in, W(kLn1W),
                                stat(kLn1Mean, slot, i), stat(kLn1Rstd, slot, i), N, C);
    if (layer_done) layer_done(l);
  }
  if (lay.first)
    Backend::encoder_backward(G(lay.wte), G(lay.wpe), dres, tokens, B, T, C, lay.vocab_begin,
                              lay.vocab_rows);
}

template class Gpt<CpuBackend>;
#ifdef TESSERA_CUDA
template class Gpt<CudaBackend<float>>;
template class Gpt<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
