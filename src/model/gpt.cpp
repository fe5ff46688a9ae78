#include "model/gpt.hpp"

#include <cstring>

#include "backend/cpu/ops.hpp"

namespace tessera {

using namespace tessera::cpu;

Gpt::Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots)
    : layout_(layout), tp_(tp) {
  const ModelShape& s = layout.canonical.shape;
  const size_t N = size_t(max_batch) * max_seq, C = s.n_embd;
  const size_t Cl = C / layout.tp;  // this rank's share of the heads / MLP width, per C
  const size_t L = size_t(layout.layer_end - layout.layer_begin);
  const size_t att = size_t(max_batch) * (s.n_head / layout.tp) * max_seq * max_seq;
  const size_t last = layout.last ? 1 : 0;
  struct { Slot kind; size_t size, count; } plan[] = {
      {kEncoded, N * C, 1},     {kLn1, N * C, L},          {kLn1Mean, N, L},
      {kLn1Rstd, N, L},         {kQkv, 3 * N * Cl, L},     {kAtt, att, L},
      {kAttY, N * Cl, L},       {kAttProj, N * C, L},      {kRes2, N * C, L},
      {kLn2, N * C, L},         {kLn2Mean, N, L},          {kLn2Rstd, N, L},
      {kFcH, 4 * N * Cl, L},    {kFcGelu, 4 * N * Cl, L},  {kFcProj, N * C, L},
      {kRes3, N * C, L},        {kLnF, N * C, last},       {kLnFMean, N, last},
      {kLnFRstd, N, last},      {kLogits, N * size_t(layout.vocab_rows), last},
      {kLosses, N, last},
  };
  for (const auto& p : plan) {
    offset_[p.kind] = slot_stride_;
    size_[p.kind] = p.size;
    slot_stride_ += p.size * p.count;
  }
  acts_.assign(slot_stride_ * size_t(slots), 0.0f);
  const size_t scratch_sizes[kScratchKinds] = {N * C, N * C, 3 * N * Cl, att,
                                                N * Cl, 4 * N * Cl, 4 * N * Cl, N};
  size_t total = 0;
  for (int k = 0; k < kScratchKinds; ++k) {
    scratch_offset_[k] = total;
    total += scratch_sizes[k];
  }
  scratch_.assign(total, 0.0f);
  ce_sums_.assign(2 * N, 0.0);
  targets_.resize(size_t(slots));
}

const float* Gpt::output(int slot) const {
  const int L = layout_.layer_end - layout_.layer_begin;
  return L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
}

double Gpt::forward(const float* params, int slot, const int32_t* tokens, const int32_t* targets,
                    int B, int T) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };

  if (lay.first) {
    // Vocab-parallel lookup: each rank fills its rows' tokens, tp rank 0 adds the positions once.
    encoder_forward(act(kEncoded, slot), tokens, P(lay.wte), lay.tp_rank == 0 ? P(lay.wpe) : nullptr,
                    B, T, C, lay.vocab_begin, lay.vocab_rows);
    tp_->all_reduce_sum(act(kEncoded, slot), NC);
  }
  const float* residual = act(kEncoded, slot);
  for (int l = lay.layer_begin; l < lay.layer_end; ++l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    layernorm_forward(act(kLn1, slot, i), act(kLn1Mean, slot, i), act(kLn1Rstd, slot, i), residual,
                      W(kLn1W), W(kLn1B), N, C);
    // Column-parallel c_attn: this rank's heads of q, k and v.
    matmul_forward(act(kQkv, slot, i), act(kLn1, slot, i), W(kAttnW), W(kAttnB), N, C, 3 * Cl);
    attention_forward(act(kAttY, slot, i), act(kAtt, slot, i), act(kQkv, slot, i), B, T, Cl, NHl);
    // Row-parallel c_proj: partial products summed over tp, then the replicated bias once.
    matmul_forward(act(kAttProj, slot, i), act(kAttY, slot, i), W(kAttnProjW),
                   static_cast<const float*>(nullptr), N, Cl, C);
    tp_->all_reduce_sum(act(kAttProj, slot, i), NC);
    bias_add(act(kAttProj, slot, i), W(kAttnProjB), N, C);
    residual_forward(act(kRes2, slot, i), residual, act(kAttProj, slot, i), NC);
    layernorm_forward(act(kLn2, slot, i), act(kLn2Mean, slot, i), act(kLn2Rstd, slot, i),
                      act(kRes2, slot, i), W(kLn2W), W(kLn2B), N, C);
    matmul_forward(act(kFcH, slot, i), act(kLn2, slot, i), W(kFcW), W(kFcB), N, C, 4 * Cl);
    gelu_forward(act(kFcGelu, slot, i), act(kFcH, slot, i), size_t(N) * 4 * Cl);
    matmul_forward(act(kFcProj, slot, i), act(kFcGelu, slot, i), W(kFcProjW),
                   static_cast<const float*>(nullptr), N, 4 * Cl, C);
    tp_->all_reduce_sum(act(kFcProj, slot, i), NC);
    bias_add(act(kFcProj, slot, i), W(kFcProjB), N, C);
    residual_forward(act(kRes3, slot, i), act(kRes2, slot, i), act(kFcProj, slot, i), NC);
    residual = act(kRes3, slot, i);
  }
  if (!lay.last) return 0.0;

  layernorm_forward(act(kLnF, slot), act(kLnFMean, slot), act(kLnFRstd, slot), residual,
                    P(lay.ln_f_weight), P(lay.ln_f_bias), N, C);
  // Vocab-parallel tied head over this rank's real vocabulary rows only.
  const int Vl = lay.vocab_valid();
  float* logits = act(kLogits, slot);
  matmul_forward(logits, act(kLnF, slot), P(lay.wte), static_cast<const float*>(nullptr), N, C, Vl);
  if (targets == nullptr) return 0.0;

  // Vocab-parallel cross-entropy: the max, then the sum of exponentials and the target logit,
  // are reduced over tp; full logits never exist on one rank.
  targets_[size_t(slot)].assign(targets, targets + N);
  float* row_max = scratch(kRowMax);
  crossentropy_row_max(row_max, logits, N, Vl, Vl);
  tp_->all_reduce_max(row_max, size_t(N));
  crossentropy_exp_sums(ce_sums_.data(), logits, logits, row_max, targets, N, Vl, Vl,
                        lay.vocab_begin);
  tp_->all_reduce_sum(ce_sums_.data(), 2 * size_t(N));
  float* losses = act(kLosses, slot);
  crossentropy_finish(losses, logits, ce_sums_.data(), N, Vl, Vl);
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += losses[n];
  return sum / N;
}

void Gpt::backward(const float* params, float* grads, int slot, const int32_t* tokens, int B,
                   int T, float dloss, const std::function<void(int layer)>& layer_done) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };
  auto G = [&](int tensor) { return grads + lay.tensors[size_t(tensor)].offset; };
  auto zero = [](float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); };
  const int L = lay.layer_end - lay.layer_begin;
  float* dres = scratch(kDRes);

  if (lay.last) {
    // The probabilities become their own gradient in place: probs - onehot, scaled.
    const int Vl = lay.vocab_valid();
    float* dlogits = act(kLogits, slot);
    crossentropy_backward(dlogits, dlogits, targets_[size_t(slot)].data(), dloss, N, Vl, Vl,
                          lay.vocab_begin);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), G(lay.wte), static_cast<float*>(nullptr), dlogits,
                    act(kLnF, slot), P(lay.wte), N, C, Vl);
    tp_->all_reduce_sum(scratch(kDLn), NC);
    zero(dres, NC);
    const float* last_out = L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
    layernorm_backward(dres, G(lay.ln_f_weight), G(lay.ln_f_bias), scratch(kDLn), last_out,
                       P(lay.ln_f_weight), act(kLnFMean, slot), act(kLnFRstd, slot), N, C);
  }
  // dres holds the gradient of each layer's output; the residual path passes it through
  // unchanged, so each branch's backward only adds its input gradient into it.
  for (int l = lay.layer_end - 1; l >= lay.layer_begin; --l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    auto GW = [&](LayerTensor t) { return G(lay.layer(l, t)); };
    const float* residual_in = i == 0 ? act(kEncoded, slot) : act(kRes3, slot, i - 1);

    zero(scratch(kDFcGelu), 4 * size_t(N) * Cl);
    matmul_backward(scratch(kDFcGelu), GW(kFcProjW), GW(kFcProjB), dres, act(kFcGelu, slot, i),
                    W(kFcProjW), N, 4 * Cl, C);
    zero(scratch(kDFcH), 4 * size_t(N) * Cl);
    gelu_backward(scratch(kDFcH), act(kFcH, slot, i), scratch(kDFcGelu), 4 * size_t(N) * Cl);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), GW(kFcW), GW(kFcB), scratch(kDFcH), act(kLn2, slot, i), W(kFcW),
                    N, C, 4 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC);  // column-parallel input: partial over tp
    layernorm_backward(dres, GW(kLn2W), GW(kLn2B), scratch(kDLn), act(kRes2, slot, i), W(kLn2W),
                       act(kLn2Mean, slot, i), act(kLn2Rstd, slot, i), N, C);

    zero(scratch(kDAttY), size_t(N) * Cl);
    matmul_backward(scratch(kDAttY), GW(kAttnProjW), GW(kAttnProjB), dres, act(kAttY, slot, i),
                    W(kAttnProjW), N, Cl, C);
    zero(scratch(kDQkv), 3 * size_t(N) * Cl);
    attention_backward(scratch(kDQkv), scratch(kDAtt), scratch(kDAttY), act(kQkv, slot, i),
                       act(kAtt, slot, i), B, T, Cl, NHl);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), GW(kAttnW), GW(kAttnB), scratch(kDQkv), act(kLn1, slot, i),
                    W(kAttnW), N, C, 3 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC);
    layernorm_backward(dres, GW(kLn1W), GW(kLn1B), scratch(kDLn), residual_in, W(kLn1W),
                       act(kLn1Mean, slot, i), act(kLn1Rstd, slot, i), N, C);
    if (layer_done) layer_done(l);
  }
  if (lay.first)
    encoder_backward(G(lay.wte), G(lay.wpe), dres, tokens, B, T, C, lay.vocab_begin,
                     lay.vocab_rows);
}

}  // namespace tessera
