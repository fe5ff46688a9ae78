#include "model/gpt.hpp"

#include <algorithm>
#include <cstring>

#include "backend/cpu/ops.hpp"

namespace tessera {

using namespace tessera::cpu;

Gpt::Gpt(const ParamLayout& layout, int max_batch, int max_seq)
    : layout_(layout), max_batch_(max_batch), max_seq_(max_seq) {
  const ModelShape& s = layout.shape;
  const size_t N = size_t(max_batch) * max_seq, C = s.n_embd, L = s.n_layer;
  const size_t att = size_t(max_batch) * s.n_head * max_seq * max_seq;
  struct { Slot slot; size_t size; size_t count; } plan[] = {
      {kEncoded, N * C, 1},     {kLn1, N * C, L},        {kLn1Mean, N, L},
      {kLn1Rstd, N, L},         {kQkv, 3 * N * C, L},    {kAtt, att, L},
      {kAttY, N * C, L},        {kAttProj, N * C, L},    {kRes2, N * C, L},
      {kLn2, N * C, L},         {kLn2Mean, N, L},        {kLn2Rstd, N, L},
      {kFcH, 4 * N * C, L},     {kFcGelu, 4 * N * C, L}, {kFcProj, N * C, L},
      {kRes3, N * C, L},        {kLnF, N * C, 1},        {kLnFMean, N, 1},
      {kLnFRstd, N, 1},         {kLogits, N * size_t(s.vocab_size), 1}, {kLosses, N, 1},
      {kDRes, N * C, 1},        {kDLn, N * C, 1},        {kDQkv, 3 * N * C, 1},
      {kDAtt, att, 1},          {kDAttY, N * C, 1},      {kDFcH, 4 * N * C, 1},
      {kDFcGelu, 4 * N * C, 1},
  };
  size_t total = 0;
  for (const auto& p : plan) {
    slot_offset_[p.slot] = total;
    slot_size_[p.slot] = p.size;
    total += p.size * p.count;
  }
  acts_.assign(total, 0.0f);
}

double Gpt::forward(const float* params, const int32_t* tokens, const int32_t* targets, int B,
                    int T) {
  const ModelShape& s = layout_.shape;
  const int C = s.n_embd, NH = s.n_head, V = s.vocab_size, N = B * T;
  auto P = [&](size_t tensor) { return params + layout_.tensors[tensor].offset; };

  encoder_forward(act(kEncoded), tokens, P(layout_.wte()), P(layout_.wpe()), B, T, C);
  const float* residual = act(kEncoded);
  for (int l = 0; l < s.n_layer; ++l) {
    auto W = [&](LayerTensor t) { return P(layout_.layer(l, t)); };
    layernorm_forward(act(kLn1, l), act(kLn1Mean, l), act(kLn1Rstd, l), residual, W(kLn1W),
                      W(kLn1B), N, C);
    matmul_forward(act(kQkv, l), act(kLn1, l), W(kAttnW), W(kAttnB), N, C, 3 * C);
    attention_forward(act(kAttY, l), act(kAtt, l), act(kQkv, l), B, T, C, NH);
    matmul_forward(act(kAttProj, l), act(kAttY, l), W(kAttnProjW), W(kAttnProjB), N, C, C);
    residual_forward(act(kRes2, l), residual, act(kAttProj, l), size_t(N) * C);
    layernorm_forward(act(kLn2, l), act(kLn2Mean, l), act(kLn2Rstd, l), act(kRes2, l), W(kLn2W),
                      W(kLn2B), N, C);
    matmul_forward(act(kFcH, l), act(kLn2, l), W(kFcW), W(kFcB), N, C, 4 * C);
    gelu_forward(act(kFcGelu, l), act(kFcH, l), size_t(N) * 4 * C);
    matmul_forward(act(kFcProj, l), act(kFcGelu, l), W(kFcProjW), W(kFcProjB), N, 4 * C, C);
    residual_forward(act(kRes3, l), act(kRes2, l), act(kFcProj, l), size_t(N) * C);
    residual = act(kRes3, l);
  }
  layernorm_forward(act(kLnF), act(kLnFMean), act(kLnFRstd), residual, P(layout_.ln_f_weight()),
                    P(layout_.ln_f_bias()), N, C);
  // Tied head over the real vocabulary only: the padded rows of wte never become logits.
  matmul_forward(act(kLogits), act(kLnF), P(layout_.wte()), static_cast<const float*>(nullptr), N,
                 C, V);
  if (targets == nullptr) return 0.0;

  targets_.assign(targets, targets + N);
  crossentropy_forward(act(kLosses), act(kLogits), act(kLogits), targets, N, V, V);
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += act(kLosses)[i];
  return sum / N;
}

void Gpt::backward(const float* params, float* grads, const int32_t* tokens, int B, int T,
                   float dloss) {
  const ModelShape& s = layout_.shape;
  const int C = s.n_embd, NH = s.n_head, V = s.vocab_size, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](size_t tensor) { return params + layout_.tensors[tensor].offset; };
  auto G = [&](size_t tensor) { return grads + layout_.tensors[tensor].offset; };
  auto zero = [](float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); };

  // Logits become their own gradient in place: probs - onehot, scaled.
  float* dlogits = act(kLogits);
  crossentropy_backward(dlogits, dlogits, targets_.data(), dloss, N, V, V);
  zero(act(kDLn), NC);
  matmul_backward(act(kDLn), G(layout_.wte()), static_cast<float*>(nullptr), dlogits, act(kLnF),
                  P(layout_.wte()), N, C, V);
  float* dres = act(kDRes);
  zero(dres, NC);
  const float* last = s.n_layer > 0 ? act(kRes3, s.n_layer - 1) : act(kEncoded);
  layernorm_backward(dres, G(layout_.ln_f_weight()), G(layout_.ln_f_bias()), act(kDLn), last,
                     P(layout_.ln_f_weight()), act(kLnFMean), act(kLnFRstd), N, C);

  // dres holds the gradient of each layer's output; the residual path passes it through unchanged,
  // so each branch's backward only adds its input gradient into it.
  for (int l = s.n_layer - 1; l >= 0; --l) {
    auto W = [&](LayerTensor t) { return P(layout_.layer(l, t)); };
    auto GW = [&](LayerTensor t) { return G(layout_.layer(l, t)); };
    const float* residual_in = l == 0 ? act(kEncoded) : act(kRes3, l - 1);

    zero(act(kDFcGelu), 4 * NC);
    matmul_backward(act(kDFcGelu), GW(kFcProjW), GW(kFcProjB), dres, act(kFcGelu, l), W(kFcProjW),
                    N, 4 * C, C);
    zero(act(kDFcH), 4 * NC);
    gelu_backward(act(kDFcH), act(kFcH, l), act(kDFcGelu), 4 * NC);
    zero(act(kDLn), NC);
    matmul_backward(act(kDLn), GW(kFcW), GW(kFcB), act(kDFcH), act(kLn2, l), W(kFcW), N, C, 4 * C);
    layernorm_backward(dres, GW(kLn2W), GW(kLn2B), act(kDLn), act(kRes2, l), W(kLn2W),
                       act(kLn2Mean, l), act(kLn2Rstd, l), N, C);

    zero(act(kDAttY), NC);
    matmul_backward(act(kDAttY), GW(kAttnProjW), GW(kAttnProjB), dres, act(kAttY, l),
                    W(kAttnProjW), N, C, C);
    zero(act(kDQkv), 3 * NC);
    attention_backward(act(kDQkv), act(kDAtt), act(kDAttY), act(kQkv, l), act(kAtt, l), B, T, C,
                       NH);
    zero(act(kDLn), NC);
    matmul_backward(act(kDLn), GW(kAttnW), GW(kAttnB), act(kDQkv), act(kLn1, l), W(kAttnW), N, C,
                    3 * C);
    layernorm_backward(dres, GW(kLn1W), GW(kLn1B), act(kDLn), residual_in, W(kLn1W),
                       act(kLn1Mean, l), act(kLn1Rstd, l), N, C);
  }
  encoder_backward(G(layout_.wte()), G(layout_.wpe()), dres, tokens, B, T, C);
}

}  // namespace tessera
