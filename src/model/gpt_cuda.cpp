#include "model/gpt_cuda.hpp"

#include <cuda_runtime_api.h>

#include "backend/cuda/context.hpp"
#include "backend/cuda/ops.hpp"
#include "device/check.hpp"

namespace tessera {

using namespace tessera::cuda;

template <typename F>
GptCuda<F>::GptCuda(const LocalLayout& layout, device::NcclComm* tp, int max_batch, int max_seq,
                    int slots, device::DeviceArena& arena)
    : layout_(layout), tp_(tp), arena_(&arena), max_n_(max_batch * max_seq) {
  // The same plan as Gpt's, split by element type.
  const ModelShape& s = layout.canonical.shape;
  const size_t N = size_t(max_batch) * max_seq, C = s.n_embd;
  const size_t Cl = C / layout.tp;
  const size_t L = size_t(layout.layer_end - layout.layer_begin);
  const size_t att = size_t(max_batch) * (s.n_head / layout.tp) * max_seq * max_seq;
  const size_t last = layout.last ? 1 : 0;
  struct { Slot kind; size_t size, count; } plan[] = {
      {kEncoded, N * C, 1},   {kLn1, N * C, L},        {kQkv, 3 * N * Cl, L},
      {kAtt, att, L},         {kAttY, N * Cl, L},      {kAttProj, N * C, L},
      {kRes2, N * C, L},      {kLn2, N * C, L},        {kFcH, 4 * N * Cl, L},
      {kFcGelu, 4 * N * Cl, L}, {kFcProj, N * C, L},   {kRes3, N * C, L},
      {kLnF, N * C, last},    {kLogits, N * size_t(layout.vocab_rows), last},
  };
  for (const auto& p : plan) {
    offset_[p.kind] = slot_stride_;
    size_[p.kind] = p.size;
    slot_stride_ += p.size * p.count;
  }
  struct { Stat kind; size_t size, count; } stat_plan[] = {
      {kLn1Mean, N, L}, {kLn1Rstd, N, L}, {kLn2Mean, N, L},    {kLn2Rstd, N, L},
      {kLnFMean, N, last}, {kLnFRstd, N, last}, {kLosses, N, last},
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
  h_acts_ = arena.add("activations", slot_stride_ * size_t(slots) * sizeof(F));
  h_stats_ = arena.add("layernorm statistics and losses", stat_stride_ * size_t(slots) * 4);
  h_scratch_ = arena.add("backward scratch", total * sizeof(F));
  h_row_max_ = arena.add("cross-entropy row max", N * sizeof(float));
  h_sums_ = arena.add("cross-entropy sums", 2 * N * sizeof(double));
  h_targets_ = arena.add("targets", size_t(slots) * N * sizeof(int32_t));
  host_losses_.resize(N);
}

template <typename F>
void GptCuda<F>::bind() {
  acts_ = arena_->get<F>(h_acts_);
  stats_ = arena_->get<float>(h_stats_);
  scratch_ = arena_->get<F>(h_scratch_);
  row_max_ = arena_->get<float>(h_row_max_);
  ce_sums_ = arena_->get<double>(h_sums_);
  targets_ = arena_->get<int32_t>(h_targets_);
}

template <typename F>
void GptCuda<F>::zero(F* p, size_t n) const {
  CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(F), stream()));  // 0 bits are +0 in fp32 and bf16
}

template <typename F>
const F* GptCuda<F>::output(int slot) const {
  const int L = layout_.layer_end - layout_.layer_begin;
  return L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
}

template <typename F>
double GptCuda<F>::forward(const F* params, int slot, const int32_t* tokens,
                           const int32_t* targets, int B, int T) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };
  cudaStream_t st = stream();

  if (lay.first) {
    encoder_forward(act(kEncoded, slot), tokens, P(lay.wte), lay.tp_rank == 0 ? P(lay.wpe) : nullptr,
                    B, T, C, lay.vocab_begin, lay.vocab_rows);
    tp_->all_reduce_sum(act(kEncoded, slot), NC, st);
  }
  const F* residual = act(kEncoded, slot);
  for (int l = lay.layer_begin; l < lay.layer_end; ++l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    layernorm_forward(act(kLn1, slot, i), stat(kLn1Mean, slot, i), stat(kLn1Rstd, slot, i),
                      residual, W(kLn1W), W(kLn1B), N, C);
    matmul_forward(act(kQkv, slot, i), act(kLn1, slot, i), W(kAttnW), W(kAttnB), N, C, 3 * Cl);
    attention_forward(act(kAttY, slot, i), act(kAtt, slot, i), act(kQkv, slot, i), B, T, Cl, NHl);
    matmul_forward(act(kAttProj, slot, i), act(kAttY, slot, i), W(kAttnProjW),
                   static_cast<const F*>(nullptr), N, Cl, C);
    tp_->all_reduce_sum(act(kAttProj, slot, i), NC, st);
    bias_add(act(kAttProj, slot, i), W(kAttnProjB), N, C);
    residual_forward(act(kRes2, slot, i), residual, act(kAttProj, slot, i), NC);
    layernorm_forward(act(kLn2, slot, i), stat(kLn2Mean, slot, i), stat(kLn2Rstd, slot, i),
                      act(kRes2, slot, i), W(kLn2W), W(kLn2B), N, C);
    matmul_forward(act(kFcH, slot, i), act(kLn2, slot, i), W(kFcW), W(kFcB), N, C, 4 * Cl);
    gelu_forward(act(kFcGelu, slot, i), act(kFcH, slot, i), size_t(N) * 4 * Cl);
    matmul_forward(act(kFcProj, slot, i), act(kFcGelu, slot, i), W(kFcProjW),
                   static_cast<const F*>(nullptr), N, 4 * Cl, C);
    tp_->all_reduce_sum(act(kFcProj, slot, i), NC, st);
    bias_add(act(kFcProj, slot, i), W(kFcProjB), N, C);
    residual_forward(act(kRes3, slot, i), act(kRes2, slot, i), act(kFcProj, slot, i), NC);
    residual = act(kRes3, slot, i);
  }
  if (!lay.last) return 0.0;

  layernorm_forward(act(kLnF, slot), stat(kLnFMean, slot), stat(kLnFRstd, slot), residual,
                    P(lay.ln_f_weight), P(lay.ln_f_bias), N, C);
  const int Vl = lay.vocab_valid();
  F* logits = act(kLogits, slot);
  matmul_forward(logits, act(kLnF, slot), P(lay.wte), static_cast<const F*>(nullptr), N, C, Vl);
  if (targets == nullptr) return 0.0;

  int32_t* my_targets = targets_ + size_t(slot) * max_n_;
  CUDA_CHECK(cudaMemcpyAsync(my_targets, targets, size_t(N) * sizeof(int32_t),
                             cudaMemcpyDeviceToDevice, st));
  crossentropy_row_max(row_max_, logits, N, Vl, Vl);
  tp_->all_reduce_max(row_max_, size_t(N), st);
  crossentropy_exp_sums(ce_sums_, logits, logits, row_max_, my_targets, N, Vl, Vl,
                        lay.vocab_begin);
  tp_->all_reduce_sum(ce_sums_, 2 * size_t(N), st);
  float* losses = stat(kLosses, slot);
  crossentropy_finish(losses, logits, ce_sums_, N, Vl, Vl);
  // The mean in double over the positions in order, as the CPU twin sums it.
  CUDA_CHECK(cudaMemcpyAsync(host_losses_.data(), losses, size_t(N) * sizeof(float),
                             cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += host_losses_[size_t(n)];
  return sum / N;
}

template <typename F>
void GptCuda<F>::backward(const F* params, float* grads, int slot, const int32_t* tokens, int B,
                          int T, float dloss, const std::function<void(int layer)>& layer_done) {
  const LocalLayout& lay = layout_;
  const ModelShape& s = lay.canonical.shape;
  const int C = s.n_embd, Cl = C / lay.tp, NHl = s.n_head / lay.tp, N = B * T;
  const size_t NC = size_t(N) * C;
  auto P = [&](int tensor) { return params + lay.tensors[size_t(tensor)].offset; };
  auto G = [&](int tensor) { return grads + lay.tensors[size_t(tensor)].offset; };
  const int L = lay.layer_end - lay.layer_begin;
  F* dres = scratch(kDRes);
  cudaStream_t st = stream();

  if (lay.last) {
    const int Vl = lay.vocab_valid();
    F* dlogits = act(kLogits, slot);
    crossentropy_backward(dlogits, dlogits, targets_ + size_t(slot) * max_n_, dloss, N, Vl, Vl,
                          lay.vocab_begin);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), G(lay.wte), static_cast<float*>(nullptr), dlogits,
                    act(kLnF, slot), P(lay.wte), N, C, Vl);
    tp_->all_reduce_sum(scratch(kDLn), NC, st);
    zero(dres, NC);
    const F* last_out = L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
    layernorm_backward(dres, G(lay.ln_f_weight), G(lay.ln_f_bias), scratch(kDLn), last_out,
                       P(lay.ln_f_weight), stat(kLnFMean, slot), stat(kLnFRstd, slot), N, C);
  }
  for (int l = lay.layer_end - 1; l >= lay.layer_begin; --l) {
    const int i = l - lay.layer_begin;
    auto W = [&](LayerTensor t) { return P(lay.layer(l, t)); };
    auto GW = [&](LayerTensor t) { return G(lay.layer(l, t)); };
    const F* residual_in = i == 0 ? act(kEncoded, slot) : act(kRes3, slot, i - 1);

    zero(scratch(kDFcGelu), 4 * size_t(N) * Cl);
    matmul_backward(scratch(kDFcGelu), GW(kFcProjW), GW(kFcProjB), dres, act(kFcGelu, slot, i),
                    W(kFcProjW), N, 4 * Cl, C);
    zero(scratch(kDFcH), 4 * size_t(N) * Cl);
    gelu_backward(scratch(kDFcH), act(kFcH, slot, i), scratch(kDFcGelu), 4 * size_t(N) * Cl);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), GW(kFcW), GW(kFcB), scratch(kDFcH), act(kLn2, slot, i), W(kFcW),
                    N, C, 4 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC, st);
    layernorm_backward(dres, GW(kLn2W), GW(kLn2B), scratch(kDLn), act(kRes2, slot, i), W(kLn2W),
                       stat(kLn2Mean, slot, i), stat(kLn2Rstd, slot, i), N, C);

    zero(scratch(kDAttY), size_t(N) * Cl);
    matmul_backward(scratch(kDAttY), GW(kAttnProjW), GW(kAttnProjB), dres, act(kAttY, slot, i),
                    W(kAttnProjW), N, Cl, C);
    zero(scratch(kDQkv), 3 * size_t(N) * Cl);
    attention_backward(scratch(kDQkv), scratch(kDAtt), scratch(kDAttY), act(kQkv, slot, i),
                       act(kAtt, slot, i), B, T, Cl, NHl);
    zero(scratch(kDLn), NC);
    matmul_backward(scratch(kDLn), GW(kAttnW), GW(kAttnB), scratch(kDQkv), act(kLn1, slot, i),
                    W(kAttnW), N, C, 3 * Cl);
    tp_->all_reduce_sum(scratch(kDLn), NC, st);
    layernorm_backward(dres, GW(kLn1W), GW(kLn1B), scratch(kDLn), residual_in, W(kLn1W),
                       stat(kLn1Mean, slot, i), stat(kLn1Rstd, slot, i), N, C);
    if (layer_done) layer_done(l);
  }
  if (lay.first)
    encoder_backward(G(lay.wte), G(lay.wpe), dres, tokens, B, T, C, lay.vocab_begin,
                     lay.vocab_rows);
}

template class GptCuda<float>;
template class GptCuda<bf16>;

}  // namespace tessera
