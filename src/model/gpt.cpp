#include "model/gpt.hpp"

#include <algorithm>

#include "common/error.hpp"

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
bool Gpt<Backend>::kept(Slot s) const {
  switch (options_.recompute) {
    case Recompute::None: return true;
    case Recompute::Selective: return s != kAtt && s != kAttY;
    case Recompute::Full: return s == kRes3;
  }
  return true;
}

template <class Backend>
bool Gpt<Backend>::kept(Stat s) const {
  switch (options_.recompute) {
    case Recompute::None: return true;
    case Recompute::Selective: return s != kAttLse;
    case Recompute::Full: return false;
  }
  return true;
}

template <class Backend>
Gpt<Backend>::Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots,
                  Arena& arena, const ModelOptions& options, int chunk, Comm* cp)
    : layout_(layout), tp_(tp), arena_(&arena), max_n_(max_batch * max_seq),
      max_batch_(max_batch), options_(options),
      slots_(slots), begin_(layout.chunks.at(size_t(chunk)).begin),
      end_(layout.chunks.at(size_t(chunk)).end), first_(layout.first && chunk == 0),
      last_(layout.last && chunk + 1 == int(layout.chunks.size())) {
  const ModelShape& s = layout.canonical.shape;
  if (layout.tp == 1) options_.sequence_parallel = false;
  const size_t N = size_t(max_batch) * max_seq, C = s.n_embd;
  const size_t Nr = N / size_t(seq_split());  // rows of the norms and the residual stream
  // This rank's widths: its heads of q (Q) and of q, k and v together (QKV), its MLP
  // activations (F) and the GEMM in front of them (FH: GPT-2's c_fc, or LLaMA's gate and up).
  width_.hs = s.head_size();
  width_.nh = s.n_head / layout.tp;
  width_.nkv = s.n_kv_head / layout.tp;
  width_.q = width_.nh * width_.hs;
  width_.qkv = (width_.nh + 2 * width_.nkv) * width_.hs;
  width_.f = s.ffn_hidden / layout.tp;
  width_.fh = s.arch == Arch::Llama ? 2 * width_.f : width_.f;
  const size_t Q = size_t(width_.q), QKV = size_t(width_.qkv), F = size_t(width_.f),
               FH = size_t(width_.fh);
  const size_t L = size_t(end_ - begin_);
  // The attention's (B,NH/tp,T,T) probabilities, or with fused attention each row's log-sum-exp.
  const size_t rows = size_t(max_batch) * size_t(width_.nh) * max_seq;
  const bool fused = options.fused_attention;
  const size_t att = fused ? 0 : rows * max_seq, lse = fused ? rows : 0;
  const size_t last = last_ ? 1 : 0;
  // LayerNorm keeps each row's mean and rstd, RMSNorm its rstd alone.
  const size_t mean = s.arch == Arch::Llama ? 0 : Nr;
  // Per-layer kinds (`layers` true) are kept per slot and layer, or live in the workspace.
  struct { Slot kind; size_t size; bool layers; size_t count; } plan[] = {
      {kEncoded, Nr * C, false, 1}, {kLn1, Nr * C, true, L},     {kQkv, N * QKV, true, L},
      {kAtt, att, true, L},         {kAttY, N * Q, true, L},      {kAttProj, Nr * C, true, L},
      {kRes2, Nr * C, true, L},     {kLn2, Nr * C, true, L},      {kFcH, N * FH, true, L},
      {kFcGelu, N * F, true, L},    {kFcProj, Nr * C, true, L},   {kRes3, Nr * C, true, L},
      {kLnF, Nr * C, false, last},    {kLogits, N * size_t(layout.vocab_rows), false, last},
  };
  for (const auto& p : plan) {
    size_[p.kind] = p.size;
    offset_[p.kind] = slot_stride_;
    if (!p.layers || kept(p.kind)) slot_stride_ += p.size * p.count;
  }
  // The workspace follows the slots: one layer of each recomputed kind, and under full recompute
  // the output the backward's rerun writes (the kept one may still be in flight to the next
  // stage).
  size_t work = 0;
  for (const auto& p : plan) {
    if (!p.layers || L == 0) continue;
    if (!kept(p.kind) || (p.kind == kRes3 && options.recompute == Recompute::Full)) {
      work_offset_[p.kind] = slot_stride_ * size_t(slots) + work;
      work += p.size;
    }
  }
  struct { Stat kind; size_t size; bool layers; size_t count; } stat_plan[] = {
      {kLn1Mean, mean, true, L},  {kLn1Rstd, Nr, true, L},   {kLn2Mean, mean, true, L},
      {kLn2Rstd, Nr, true, L},    {kAttLse, lse, true, L},   {kLnFMean, mean, false, last},
      {kLnFRstd, Nr, false, last},
  };
  for (const auto& p : stat_plan) {
    stat_size_[p.kind] = p.size;
    stat_offset_[p.kind] = stat_stride_;
    if (!p.layers || kept(p.kind)) stat_stride_ += p.size * p.count;
  }
  size_t stat_work = 0;
  for (const auto& p : stat_plan) {
    if (p.layers && L > 0 && !kept(p.kind)) {
      stat_work_offset_[p.kind] = stat_stride_ * size_t(slots) + stat_work;
      stat_work += p.size;
    }
  }
  const size_t sp = options_.sequence_parallel ? 1 : 0;
  const size_t scratch_sizes[kScratchKinds] = {
      Nr * C, N * C, N * QKV, att, N * Q, N * FH, N * F,
      sp * N * C, sp * N * C, sp * N * C, sp * Nr * C};
  size_t total = 0;
  for (int k = 0; k < kScratchKinds; ++k) {
    scratch_offset_[k] = total;
    total += scratch_sizes[k];
  }
  const std::string of = layout.chunks.size() > 1 ? " (chunk " + std::to_string(chunk) + ")" : "";
  h_acts_ = arena.add("activations" + of, (slot_stride_ * size_t(slots) + work) * sizeof(Act));
  h_stats_ = arena.add("statistics (layernorm, attention log-sum-exp)" + of,
                       (stat_stride_ * size_t(slots) + stat_work) * 4);
  h_scratch_ = arena.add("scratch" + of, total * sizeof(Act));
  h_row_max_ = arena.add("cross-entropy row max", N * sizeof(float));
  h_sums_ = arena.add("cross-entropy sums", 2 * N * sizeof(double));
  h_targets_ = arena.add("targets", size_t(slots) * N * sizeof(int32_t));
  if (cp != nullptr && cp->size() > 1) {
    cp_size_ = cp->size();
    cp_rank_ = cp->rank();
    context_ = std::make_unique<ContextAttention<Backend>>(
        cp, options.cp_allgather, max_batch, max_seq, width_.nh, width_.nkv, width_.hs, arena);
  }
  // FP8 GEMMs: the largest input and output gradient of this chunk's linear layers, each weight.
  if (options.fp8.on) {
    const bool head = last_ && options.fp8.head;
    const size_t V = head ? size_t(layout.vocab_rows) : 0;
    Fp8Sizes sizes;
    sizes.input = N * std::max({C, Q, F});
    sizes.grad = N * std::max({QKV, C, FH, V});
    sizes.weight[Fp8State::kQkv] = QKV * C;
    sizes.weight[Fp8State::kProj] = C * Q;
    sizes.weight[Fp8State::kFc] = FH * C;
    sizes.weight[Fp8State::kDown] = C * F;
    sizes.head = V * C;
    fp8_ = std::make_unique<Fp8Linear<Backend>>(options.fp8, begin_, end_, head, tp, cp, sizes,
                                                arena);
  }
  // LLaMA's rotary table: (T, hs/2) cos and sin pairs.
  if (s.arch == Arch::Llama)
    h_rope_ = arena.add("rotary table" + of, size_t(max_seq) * size_t(width_.hs) * sizeof(float));
}

template <class Backend>
void Gpt<Backend>::poison_transient() {
  Backend::poison(acts_, arena_->bytes(h_acts_));
  Backend::poison(stats_, arena_->bytes(h_stats_));
  Backend::poison(scratch_, arena_->bytes(h_scratch_));
  Backend::poison(row_max_, arena_->bytes(h_row_max_));
}

template <class Backend>
void Gpt<Backend>::bind() {
  acts_ = arena_->get<Act>(h_acts_);
  stats_ = arena_->get<float>(h_stats_);
  scratch_ = arena_->get<Act>(h_scratch_);
  row_max_ = arena_->get<float>(h_row_max_);
  ce_sums_ = arena_->get<double>(h_sums_);
  targets_ = arena_->get<int32_t>(h_targets_);
  if (context_) context_->bind();
  if (fp8_) fp8_->bind();
  if (layout_.canonical.shape.arch == Arch::Llama) {
    rope_ = arena_->get<float>(h_rope_);
    const ModelShape& s = layout_.canonical.shape;
    // Row t of the table is local token t's: under context parallelism its true position's.
    const int Tl = max_n_ / max_batch_, T = Tl * cp_size_, hs = width_.hs;
    std::vector<float> full(size_t(T) * size_t(hs)), table(size_t(Tl) * size_t(hs));
    cpu::rope_table(full.data(), T, hs, s.rope_theta);
    for (int t = 0; t < Tl; ++t) {
      const int at = cp_size_ > 1 ? context_position(t, Tl, cp_size_, cp_rank_) : t;
      std::copy(full.begin() + long(at) * hs, full.begin() + long(at + 1) * hs,
                table.begin() + long(t) * hs);
    }
    Backend::to_device(rope_, table.data(), table.size() * sizeof(float));
  }
}

template <class Backend>
const typename Backend::Act* Gpt<Backend>::output(int slot) const {
  const int L = end_ - begin_;
  return L > 0 ? act(kRes3, slot, L - 1) : act(kEncoded, slot);
}

template <class Backend>
std::vector<std::pair<size_t, size_t>> Gpt<Backend>::tp_partial_gradients(int l) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (!options_.sequence_parallel) return out;
  const LocalLayout& lay = layout_;
  auto add = [&](int tensor) {
    if (tensor < 0) return;
    const LocalTensor& t = lay.tensors[size_t(tensor)];
    out.emplace_back(t.offset, t.offset + t.numel);
  };
  if (l < 0) {
    add(lay.norm_weight);
    add(lay.norm_bias);
  } else {
    for (LayerTensor k : {kLn1W, kLn1B, kLn2W, kLn2B, kInNormW, kPostNormW})
      if (lay.canonical.has(k)) add(lay.layer(l, k));
  }
  return out;
}

template <class Backend>
const typename Backend::Act* Gpt<Backend>::gather_rows(const Act* rows, Act* full, int N) {
  if (!options_.sequence_parallel) return rows;
  tp_->all_gather(rows, full, size_t(N / seq_split()) * n_embd());
  return full;
}

template <class Backend>
typename Backend::Act* Gpt<Backend>::reduce_rows(Act* partial, Act* rows, int N) {
  if (!options_.sequence_parallel) {
    tp_->all_reduce_sum(partial, size_t(N) * n_embd());
    return partial;
  }
  tp_->reduce_scatter_sum(partial, rows, size_t(N / seq_split()) * n_embd());
  return rows;
}

template <class Backend>
typename Gpt<Backend>::LayerActs Gpt<Backend>::layer_acts(int slot, int i,
                                                          bool recomputing) const {
  auto A = [&](Slot k) { return kept(k) ? act(k, slot, i) : work(k); };
  auto S = [&](Stat k) { return kept(k) ? stat(k, slot, i) : work(k); };
  LayerActs a;
  a.in = i == 0 ? act(kEncoded, slot) : act(kRes3, slot, i - 1);
  a.ln1 = A(kLn1), a.qkv = A(kQkv), a.att = A(kAtt), a.atty = A(kAttY), a.attproj = A(kAttProj);
  a.res2 = A(kRes2), a.ln2 = A(kLn2), a.fch = A(kFcH), a.fcgelu = A(kFcGelu);
  a.fcproj = A(kFcProj);
  a.out = recomputing ? work(kRes3) : act(kRes3, slot, i);
  a.ln1_mean = S(kLn1Mean), a.ln1_rstd = S(kLn1Rstd), a.ln2_mean = S(kLn2Mean);
  a.ln2_rstd = S(kLn2Rstd), a.lse = S(kAttLse);
  return a;
}

template <class Backend>
void Gpt<Backend>::attention_core(const LayerActs& a, int B, int T) {
  const Width& w = width_;
  if (context_)
    context_->forward(a.atty, a.lse, a.qkv, B);
  else if (options_.fused_attention)
    Backend::attention_fused_forward(a.atty, a.lse, a.qkv, B, T, w.nh, w.nkv, w.hs);
  else
    Backend::attention_forward(a.atty, a.att, a.qkv, B, T, w.nh, w.nkv, w.hs);
}

// Under context parallelism each of a sequence's two chunks (T / 2 rows each) sits at its own
// true positions: f(at, pos, Tc) for each, at its first row in (B,T), pos its first position.
template <class Backend>
template <class F>
void Gpt<Backend>::each_chunk(int B, int T, F f) const {
  const int Tc = T / 2;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      f(size_t(b) * T + size_t(h) * Tc, size_t(context_position(h * Tc, T, cp_size_, cp_rank_)),
        Tc);
}

template <class Backend>
void Gpt<Backend>::encode(Act* out, const int32_t* tokens, const Act* embed, const Act* positions,
                          int B, int T) {
  const LocalLayout& lay = layout_;
  const int C = n_embd();
  if (!context_) {
    Backend::encoder_forward(out, tokens, embed, positions, B, T, C, lay.vocab_begin,
                             lay.vocab_rows);
    return;
  }
  each_chunk(B, T, [&](size_t at, size_t pos, int Tc) {
    Backend::encoder_forward(out + at * C, tokens + at, embed,
                             positions ? positions + pos * C : positions, 1, Tc, C,
                             lay.vocab_begin, lay.vocab_rows);
  });
}

template <class Backend>
void Gpt<Backend>::encode_backward(float* dembed, float* dpositions, const Act* dout,
                                   const int32_t* tokens, int B, int T) {
  const LocalLayout& lay = layout_;
  const int C = n_embd();
  if (!context_) {
    Backend::encoder_backward(dembed, dpositions, dout, tokens, B, T, C, lay.vocab_begin,
                              lay.vocab_rows);
    return;
  }
  each_chunk(B, T, [&](size_t at, size_t pos, int Tc) {
    Backend::encoder_backward(dembed, dpositions ? dpositions + pos * C : dpositions,
                              dout + at * C, tokens + at, 1, Tc, C, lay.vocab_begin,
                              lay.vocab_rows);
  });
}

template <class Backend>
typename Gpt<Backend>::LayerWeights Gpt<Backend>::layer_weights(const Act* params, float* grads,
                                                                int l) const {
  const LocalLayout& lay = layout_;
  const size_t begin = lay.units[size_t(lay.layer_unit(l))].begin;
  auto at = [&](LayerTensor t) -> size_t {
    return lay.canonical.has(t) ? lay.tensors[size_t(lay.layer(l, t))].offset - begin : size_t(-1);
  };
  auto P = [&](LayerTensor t) { return at(t) == size_t(-1) ? nullptr : params + at(t); };
  auto G = [&](LayerTensor t) {
    return at(t) == size_t(-1) || grads == nullptr ? nullptr : grads + at(t);
  };
  // The GEMMs' weights of q, k and v (and of gate and up) are adjacent shards: one GEMM each.
  const bool llama = lay.canonical.shape.arch == Arch::Llama;
  const LayerTensor kinds[6][2] = {
      {kLn1W, kInNormW}, {kAttnW, kQW}, {kAttnProjW, kOW}, {kLn2W, kPostNormW}, {kFcW, kGateW},
      {kFcProjW, kDownW}};
  const LayerTensor biases[6] = {kLn1B, kAttnB, kAttnProjB, kLn2B, kFcB, kFcProjB};
  LayerWeights w;
  const Act** p[6] = {&w.norm1, &w.qkv, &w.proj, &w.norm2, &w.fc, &w.down};
  float** g[6] = {&w.g_norm1, &w.g_qkv, &w.g_proj, &w.g_norm2, &w.g_fc, &w.g_down};
  const Act** pb[6] = {&w.norm1_b, &w.qkv_b, &w.proj_b, &w.norm2_b, &w.fc_b, &w.down_b};
  float** gb[6] = {&w.g_norm1_b, &w.g_qkv_b, &w.g_proj_b, &w.g_norm2_b, &w.g_fc_b, &w.g_down_b};
  for (int k = 0; k < 6; ++k) {
    *p[k] = P(kinds[k][llama]);
    *g[k] = G(kinds[k][llama]);
    *pb[k] = llama ? nullptr : P(biases[k]);
    *gb[k] = llama ? nullptr : G(biases[k]);
  }
  return w;
}

template <class Backend>
void Gpt<Backend>::norm_forward(Act* out, float* mean, float* rstd, const Act* in, const Act* weight,
                                const Act* bias, int rows) {
  const ModelShape& s = layout_.canonical.shape;
  if (s.arch == Arch::Llama)
    Backend::rmsnorm_forward(out, rstd, in, weight, rows, s.n_embd, s.norm_eps);
  else
    Backend::layernorm_forward(out, mean, rstd, in, weight, bias, rows, s.n_embd);
}

template <class Backend>
void Gpt<Backend>::norm_backward(Act* din, float* dweight, float* dbias, const Act* dout,
                                 const Act* in, const Act* weight, const float* mean,
                                 const float* rstd, int rows) {
  const ModelShape& s = layout_.canonical.shape;
  if (s.arch == Arch::Llama)
    Backend::rmsnorm_backward(din, dweight, dout, in, weight, rstd, rows, s.n_embd);
  else
    Backend::layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, rows, s.n_embd);
}

// N = B*T rows pass the column-parallel GEMMs and the attention; Nr = N / seq_split() rows pass
// the norms, biases and residual adds (all of them without sequence parallelism). The two
// families differ in the norm (LayerNorm with bias / RMSNorm), the biases, the rotary
// embedding of q and k, and the MLP's activation (GELU / SwiGLU of gate and up).
template <class Backend>
void Gpt<Backend>::layer_forward(const Act* params, int l, const LayerActs& a, int B, int T) {
  const Width& wd = width_;
  const int C = n_embd(), N = B * T, Nr = N / seq_split();
  const size_t NrC = size_t(Nr) * C;
  const bool sp = options_.sequence_parallel, llama = layout_.canonical.shape.arch == Arch::Llama;
  const Act* none = nullptr;
  const LayerWeights w = layer_weights(params, nullptr, l);
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, w.norm1, w.norm1_b, Nr);
  // Column-parallel q, k, v: this rank's heads of each.
  linear_forward(l, Fp8State::kQkv, a.qkv, gather_rows(a.ln1, scratch(kGather), N), w.qkv, w.qkv_b,
                 N, C, wd.qkv);
  if (llama) Backend::rope_forward(a.qkv, rope_, B, T, wd.nh, wd.nkv, wd.hs);
  attention_core(a, B, T);
  // Row-parallel projection: partial products summed over tp, then the replicated bias once.
  Act* partial = sp ? scratch(kPartial) : a.attproj;
  linear_forward(l, Fp8State::kProj, partial, a.atty, w.proj, none, N, wd.q, C);
  reduce_rows(partial, a.attproj, N);
  if (w.proj_b) Backend::bias_add(a.attproj, w.proj_b, Nr, C);
  Backend::residual_forward(a.res2, a.in, a.attproj, NrC);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.norm2, w.norm2_b, Nr);
  linear_forward(l, Fp8State::kFc, a.fch, gather_rows(a.ln2, scratch(kGather), N), w.fc, w.fc_b, N,
                 C, wd.fh);
  if (llama)
    Backend::swiglu_forward(a.fcgelu, a.fch, N, wd.f);
  else
    Backend::gelu_forward(a.fcgelu, a.fch, size_t(N) * wd.f);
  partial = sp ? scratch(kPartial) : a.fcproj;
  linear_forward(l, Fp8State::kDown, partial, a.fcgelu, w.down, none, N, wd.f, C);
  reduce_rows(partial, a.fcproj, N);
  if (w.down_b) Backend::bias_add(a.fcproj, w.down_b, Nr, C);
  Backend::residual_forward(a.out, a.res2, a.fcproj, NrC);
}

template <class Backend>
std::vector<int> Gpt<Backend>::pass_units(bool forward) const {
  const LocalLayout& lay = layout_;
  std::vector<int> in, layers, out;
  if (first_) {
    in.push_back(unit(lay.embed));
    if (lay.positions >= 0) in.push_back(unit(lay.positions));
  }
  for (int l = begin_; l < end_; ++l) layers.push_back(lay.layer_unit(l));
  if (last_) {
    out.push_back(unit(lay.norm_weight));
    if (lay.norm_bias >= 0) out.push_back(unit(lay.norm_bias));
    out.push_back(unit(lay.head));
  }
  if (!forward) {
    // The backward reads the head, the final norm's weight (not its bias), the layers from the
    // top; the embedding's backward reads no parameters.
    std::vector<int> back;
    if (last_) back = {unit(lay.head), unit(lay.norm_weight)};
    back.insert(back.end(), layers.rbegin(), layers.rend());
    return back;
  }
  in.insert(in.end(), layers.begin(), layers.end());
  in.insert(in.end(), out.begin(), out.end());
  return in;
}

template <class Backend>
void Gpt<Backend>::forward(Weights<Act>& weights, int slot, const int32_t* tokens,
                           const int32_t* targets, float* losses, int B, int T) {
  const LocalLayout& lay = layout_;
  const int C = n_embd(), N = B * T, Nr = N / seq_split();
  const Act* none = nullptr;
  weights.pass(pass_units(true));
  // A tensor outside the layers is a unit of its own: its parameters, or nullptr where this rank
  // (or the family) has none; done() releases them.
  auto P = [&](int tensor) { return tensor < 0 ? none : weights.params(unit(tensor)); };
  auto done = [&](int tensor) {
    if (tensor >= 0) weights.params_done(unit(tensor));
  };

  if (first_) {
    // Vocab-parallel lookup: each rank fills its rows' tokens, tp rank 0 adds the positions once;
    // the sum over tp is the stage's input.
    Act* partial = options_.sequence_parallel ? scratch(kPartial) : act(kEncoded, slot);
    const Act* embed = P(lay.embed);
    const Act* positions = P(lay.positions);
    encode(partial, tokens, embed, lay.tp_rank == 0 ? positions : none, B, T);
    done(lay.embed);
    done(lay.positions);
    reduce_rows(partial, act(kEncoded, slot), N);
  }
  for (int l = begin_; l < end_; ++l) {
    const int u = lay.layer_unit(l);
    layer_forward(weights.params(u), l, layer_acts(slot, l - begin_, false), B, T);
    weights.params_done(u);
  }
  if (!last_) return;

  const Act* norm_weight = P(lay.norm_weight);
  const Act* norm_bias = P(lay.norm_bias);
  norm_forward(act(kLnF, slot), stat(kLnFMean, slot), stat(kLnFRstd, slot), output(slot),
               norm_weight, norm_bias, Nr);
  done(lay.norm_weight);
  done(lay.norm_bias);
  // Vocab-parallel head over this rank's rows (head_columns(): the real ones, or with the
  // padding where the backend wants aligned GEMMs; the cross-entropy reads the real ones).
  const int Vh = head_columns(), Vl = lay.vocab_valid();
  Act* logits = act(kLogits, slot);
  linear_forward(Fp8State::kHead, 0, logits, gather_rows(act(kLnF, slot), scratch(kGather), N),
                 P(lay.head), none, N, C, Vh);
  done(lay.head);
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
void Gpt<Backend>::layer_backward(const Act* params, float* grads, int l, const LayerActs& a,
                                  int B, int T) {
  const Width& wd = width_;
  const int C = n_embd(), N = B * T, Nr = N / seq_split();
  const size_t NC = size_t(N) * C;
  const bool llama = layout_.canonical.shape.arch == Arch::Llama;
  const LayerWeights w = layer_weights(params, grads, l);
  // dres holds the gradient of the layer's output (this rank's rows); the residual path passes
  // it through unchanged, so each branch's backward only adds its input gradient into it. The
  // row-parallel GEMMs read it whole (all-gathered), and the column-parallel GEMMs' input
  // gradients are partial sums over tp, reduced back into this rank's rows.
  Act* dres = scratch(kDRes);
  zero(scratch(kDFcGelu), size_t(N) * wd.f);
  linear_backward(l, Fp8State::kDown, scratch(kDFcGelu), w.g_down, w.g_down_b,
                  gather_rows(dres, scratch(kDFull), N), a.fcgelu, w.down, N, wd.f, C);
  zero(scratch(kDFcH), size_t(N) * wd.fh);
  if (llama)
    Backend::swiglu_backward(scratch(kDFcH), a.fch, scratch(kDFcGelu), N, wd.f);
  else
    Backend::gelu_backward(scratch(kDFcH), a.fch, scratch(kDFcGelu), size_t(N) * wd.f);
  zero(scratch(kDLn), NC);
  linear_backward(l, Fp8State::kFc, scratch(kDLn), w.g_fc, w.g_fc_b, scratch(kDFcH),
                  gather_rows(a.ln2, scratch(kGather), N), w.fc, N, C, wd.fh);
  const Act* dln2 = reduce_rows(scratch(kDLn), scratch(kDLnRows), N);
  norm_backward(dres, w.g_norm2, w.g_norm2_b, dln2, a.res2, w.norm2, a.ln2_mean, a.ln2_rstd, Nr);

  zero(scratch(kDAttY), size_t(N) * wd.q);
  linear_backward(l, Fp8State::kProj, scratch(kDAttY), w.g_proj, w.g_proj_b,
                  gather_rows(dres, scratch(kDFull), N), a.atty, w.proj, N, wd.q, C);
  zero(scratch(kDQkv), size_t(N) * wd.qkv);
  if (context_)
    context_->backward(scratch(kDQkv), scratch(kDAttY), a.qkv, a.atty, a.lse, B);
  else if (options_.fused_attention)
    Backend::attention_fused_backward(scratch(kDQkv), scratch(kDAttY), a.qkv, a.atty, a.lse, B, T,
                                      wd.nh, wd.nkv, wd.hs);
  else
    Backend::attention_backward(scratch(kDQkv), scratch(kDAtt), scratch(kDAttY), a.qkv, a.att, B,
                                T, wd.nh, wd.nkv, wd.hs);
  if (llama) Backend::rope_backward(scratch(kDQkv), rope_, B, T, wd.nh, wd.nkv, wd.hs);
  zero(scratch(kDLn), NC);
  linear_backward(l, Fp8State::kQkv, scratch(kDLn), w.g_qkv, w.g_qkv_b, scratch(kDQkv),
                  gather_rows(a.ln1, scratch(kGather), N), w.qkv, N, C, wd.qkv);
  const Act* dln1 = reduce_rows(scratch(kDLn), scratch(kDLnRows), N);
  norm_backward(dres, w.g_norm1, w.g_norm1_b, dln1, a.in, w.norm1, a.ln1_mean, a.ln1_rstd, Nr);
}

template <class Backend>
void Gpt<Backend>::backward(Weights<Act>& weights, int slot, const int32_t* tokens, int B, int T,
                            float dloss, const std::function<void(int layer)>& layer_done) {
  const LocalLayout& lay = layout_;
  const int C = n_embd(), N = B * T, Nr = N / seq_split();
  weights.pass(pass_units(false));
  const Act* none = nullptr;
  float* const no_grad = nullptr;
  // A tensor outside the layers is a unit of its own (see forward).
  auto P = [&](int tensor) { return tensor < 0 ? none : weights.params(unit(tensor)); };
  auto G = [&](int tensor) { return tensor < 0 ? no_grad : weights.grads(unit(tensor)); };
  auto done = [&](int tensor, bool read_params) {
    if (tensor < 0) return;
    if (read_params) weights.params_done(unit(tensor));
    weights.grads_done(unit(tensor));
  };
  Act* dres = scratch(kDRes);

  if (last_) {
    // The probabilities become their own gradient in place: probs - onehot, scaled (0 on the
    // padding columns, so the padding rows of the head get no gradient).
    const int Vh = head_columns(), Vl = lay.vocab_valid();
    Act* dlogits = act(kLogits, slot);
    Backend::crossentropy_backward(dlogits, dlogits, targets_ + size_t(slot) * max_n_, dloss, N,
                                   Vh, Vl, lay.vocab_begin);
    zero(scratch(kDLn), size_t(N) * C);
    const Act* head = P(lay.head);
    linear_backward(Fp8State::kHead, 0, scratch(kDLn), G(lay.head), no_grad, dlogits,
                    gather_rows(act(kLnF, slot), scratch(kGather), N), head, N, C, Vh);
    done(lay.head, true);
    const Act* dlnf = reduce_rows(scratch(kDLn), scratch(kDLnRows), N);
    zero(dres, size_t(Nr) * C);
    const Act* norm_weight = P(lay.norm_weight);
    norm_backward(dres, G(lay.norm_weight), G(lay.norm_bias), dlnf, output(slot), norm_weight,
                  stat(kLnFMean, slot), stat(kLnFRstd, slot), Nr);
    done(lay.norm_weight, true);
    done(lay.norm_bias, false);
  }
  for (int l = end_ - 1; l >= begin_; --l) {
    const int i = l - begin_, u = lay.layer_unit(l);
    const Act* params = weights.params(u);
    float* grads = weights.grads(u);
    if (options_.recompute == Recompute::Full) {
      // Rerun the layer's forward from its kept input, then its backward reads what it wrote.
      const LayerActs a = layer_acts(slot, i, true);
      layer_forward(params, l, a, B, T);
      layer_backward(params, grads, l, a, B, T);
    } else {
      const LayerActs a = layer_acts(slot, i, false);
      if (options_.recompute == Recompute::Selective) attention_core(a, B, T);
      layer_backward(params, grads, l, a, B, T);
    }
    weights.params_done(u);
    weights.grads_done(u);
    if (layer_done) layer_done(l);
  }
  if (first_) {
    encode_backward(G(lay.embed), G(lay.positions), gather_rows(dres, scratch(kDFull), N), tokens,
                    B, T);
    done(lay.embed, false);
    done(lay.positions, false);
  }
}

template class Gpt<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp).
template Gpt<DeclareBackend<float>>::Gpt(const LocalLayout&, Comm*, int, int, int, Arena&, const ModelOptions&, int, Comm*);
template Gpt<DeclareBackend<Bf16Bytes>>::Gpt(const LocalLayout&, Comm*, int, int, int, Arena&, const ModelOptions&, int, Comm*);
#ifdef TESSERA_CUDA
template class Gpt<CudaBackend<float>>;
template class Gpt<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
