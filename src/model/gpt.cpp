#include "model/gpt.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "model/mlp.hpp"

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
    case Recompute::Full: return s == kOut;
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

namespace {

ModelOptions stage_options(ModelOptions options, int tp) {
  if (tp == 1) options.sequence_parallel = false;
  return options;
}

}  // namespace

template <class Backend>
Gpt<Backend>::Gpt(const LocalLayout& layout, Comm* tp, int max_batch, int max_seq, int slots,
                  Arena& arena, const ModelOptions& options, int chunk, Comm* cp, Comm* ep)
    : layout_(layout), tp_(tp), arena_(&arena), max_n_(max_batch * max_seq),
      max_batch_(max_batch), options_(stage_options(options, layout.tp)),
      block_(layout_, options_, tp, max_batch, max_seq),
      slots_(slots), docs_(size_t(slots)),
      begin_(layout.chunks.at(size_t(chunk)).begin),
      end_(layout.chunks.at(size_t(chunk)).end), first_(layout.first && chunk == 0),
      last_(layout.last && chunk + 1 == int(layout.chunks.size())) {
  const Family& family = tessera::family(layout.canonical.shape.arch);
  const size_t N = size_t(max_batch) * max_seq, C = size_t(n_embd());
  const size_t Nr = N / size_t(seq_split());  // rows of the norms and the residual stream
  // This rank's widths (model/family.hpp): its heads of q (Q) and of q, k and v together (QKV),
  // its MLP activations (F) and fc1's output in front of them (FC1: GPT-2's c_fc, or LLaMA's
  // gate and up).
  const BlockWidths& w = block_.width();
  // An MoE layer's shared experts keep theirs in the same slots: the wider of the two MLPs.
  const size_t Q = size_t(w.q), QKV = size_t(w.qkv);
  const size_t F = size_t(std::max(w.f, w.sf)), FC1 = size_t(std::max(w.fc1, w.sfc1));
  const size_t L = size_t(end_ - begin_);
  // The attention's (B,NH/tp,T,T) probabilities, or with fused attention each row's log-sum-exp.
  const size_t rows = size_t(max_batch) * size_t(w.nh) * max_seq;
  const bool fused = options.fused_attention;
  const size_t att = fused ? 0 : rows * max_seq, lse = fused ? rows : 0;
  const size_t last = last_ ? 1 : 0;
  // LayerNorm keeps each row's mean and rstd, RMSNorm its rstd alone.
  const size_t mean = family.norm == NormKind::LayerNorm ? Nr : 0;
  // model.qk_norm: the q and k heads before their norm, and each one's rstd.
  const size_t qk_heads = layout.canonical.shape.qk_norm ? size_t(w.nh + w.nkv) : 0;
  // Per-layer kinds (`layers` true) are kept per slot and layer, or live in the workspace.
  struct { Slot kind; size_t size; bool layers; size_t count; } plan[] = {
      {kEncoded, Nr * C, false, 1}, {kNorm1, Nr * C, true, L},    {kQkv, N * QKV, true, L},
      {kQkRaw, N * qk_heads * size_t(w.hs), true, L},             {kAtt, att, true, L},
      {kAttY, N * Q, true, L},      {kAttProj, Nr * C, true, L},
      {kRes2, Nr * C, true, L},     {kNorm2, Nr * C, true, L},    {kFc1, N * FC1, true, L},
      {kMlpAct, N * F, true, L},    {kFc2, Nr * C, true, L},      {kOut, Nr * C, true, L},
      {kNormF, Nr * C, false, last},  {kLogits, N * size_t(layout.vocab_rows), false, last},
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
    if (!kept(p.kind) || (p.kind == kOut && options.recompute == Recompute::Full)) {
      work_offset_[p.kind] = slot_stride_ * size_t(slots) + work;
      work += p.size;
    }
  }
  struct { Stat kind; size_t size; bool layers; size_t count; } stat_plan[] = {
      {kNorm1Mean, mean, true, L},     {kNorm1Rstd, Nr, true, L}, {kNorm2Mean, mean, true, L},
      {kNorm2Rstd, Nr, true, L},       {kAttLse, lse, true, L},
      {kQkRstd, N * qk_heads, true, L}, {kNormFMean, mean, false, last},
      {kNormFRstd, Nr, false, last},
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
  const std::string of = layout.chunks.size() > 1 ? " (chunk " + std::to_string(chunk) + ")" : "";
  h_acts_ = arena.add("activations" + of, (slot_stride_ * size_t(slots) + work) * sizeof(Act));
  h_stats_ = arena.add("statistics (layernorm, attention log-sum-exp)" + of,
                       (stat_stride_ * size_t(slots) + stat_work) * 4);
  h_scratch_ = arena.add("scratch" + of, block_.scratch_elems() * sizeof(Act));
  h_row_max_ = arena.add("cross-entropy row max", N * sizeof(float));
  h_sums_ = arena.add("cross-entropy sums", 2 * N * sizeof(double));
  h_targets_ = arena.add("targets", size_t(slots) * N * sizeof(int32_t));
  if (cp != nullptr && cp->size() > 1) {
    cp_size_ = cp->size();
    cp_rank_ = cp->rank();
    context_ = std::make_unique<ContextAttention<Backend>>(
        cp, options.cp_allgather, max_batch, max_seq, w.nh, w.nkv, w.hs, arena);
  }
  // The chunk's mixture-of-experts layers keep their own activations (model/moe_layer.hpp).
  std::vector<int> routed;
  for (int l = begin_; l < end_; ++l)
    if (layout.canonical.shape.moe.layer(l)) routed.push_back(l);
  // Whole experts on every tp rank (parallel.expert_tp = 1): each routes its own Nr rows through
  // its experts' whole width; tp then only sums the router's statistics.
  if (!routed.empty() && layout.experts_whole) {
    BlockWidths whole = w;
    whole.ef = layout.canonical.shape.moe.ffn;
    whole.efc1 = mlp_fc1_columns(family.mlp, whole.ef);
    moe_ = std::make_unique<MoeLayer<Backend>>(layout.canonical.shape, whole, options_.moe, routed,
                                               slots, int(Nr), nullptr, cp, ep, arena, tp);
  } else if (!routed.empty()) {
    moe_ = std::make_unique<MoeLayer<Backend>>(layout.canonical.shape, w, options_.moe, routed,
                                               slots, int(N), tp, cp, ep, arena);
  }
  // FP8 GEMMs: the largest input and output gradient of this chunk's linear layers (the layers'
  // GEMMs, model/cost.hpp, and the head's), each weight. An MoE layer's are its attention's and
  // its shared experts' (a dense MLP of their own width, which may be the wider), and its routed
  // experts', on the most rows its held experts compute.
  if (options.fp8.on) {
    const bool head = last_ && options.fp8.head;
    const size_t V = head ? size_t(layout.vocab_rows) : 0;
    Fp8Sizes sizes;
    size_t widest_in = V > 0 ? C : 0, widest_out = V;  // the head's (N,C) by (V,C)
    const ModelShape& shape = layout.canonical.shape;
    std::vector<LinearGemm> gemms;
    if (routed.size() < size_t(end_ - begin_)) gemms = block_.cost().gemms;
    if (moe_)
      for (const LinearGemm& g : block_cost(shape, layout.tp, true).gemms) gemms.push_back(g);
    for (const LinearGemm& g : gemms) {
      widest_in = std::max(widest_in, size_t(g.in));
      widest_out = std::max(widest_out, size_t(g.out));
      sizes.weight[g.gemm] = std::max(sizes.weight[g.gemm], size_t(g.out) * size_t(g.in));
    }
    sizes.input = N * widest_in;
    sizes.grad = N * widest_out;
    sizes.head = V * C;
    Fp8Experts experts;
    if (moe_) {
      const size_t rows = moe_->rows_in(), F = size_t(w.ef), FC1 = size_t(w.efc1);
      sizes.input = std::max(sizes.input, rows * std::max(C, F));
      sizes.grad = std::max(sizes.grad, rows * std::max(C, FC1));
      experts = {routed, shape.moe.experts, moe_->held(), moe_->first_held(), FC1 * C, C * F};
    }
    fp8_ = std::make_unique<Fp8Linear<Backend>>(options.fp8, begin_, end_, head, tp, cp, sizes,
                                                arena, experts);
  }
  // Rotary positions' table: (T, hs/2) cos and sin pairs.
  if (family.position == Positions::Rotary)
    h_rope_ = arena.add("rotary table" + of, size_t(max_seq) * size_t(w.hs) * sizeof(float));
}

template <class Backend>
void Gpt<Backend>::poison_transient() {
  Backend::poison(acts_, arena_->bytes(h_acts_));
  Backend::poison(stats_, arena_->bytes(h_stats_));
  Backend::poison(arena_->get<Act>(h_scratch_), arena_->bytes(h_scratch_));
  Backend::poison(row_max_, arena_->bytes(h_row_max_));
}

template <class Backend>
void Gpt<Backend>::bind() {
  acts_ = arena_->get<Act>(h_acts_);
  stats_ = arena_->get<float>(h_stats_);
  row_max_ = arena_->get<float>(h_row_max_);
  ce_sums_ = arena_->get<double>(h_sums_);
  targets_ = arena_->get<int32_t>(h_targets_);
  if (context_) context_->bind();
  if (fp8_) fp8_->bind();
  if (family(layout_.canonical.shape.arch).position == Positions::Rotary) fill_rope_table();
  if (moe_) moe_->bind(fp8_.get());
  block_.bind(arena_->get<Act>(h_scratch_), rope_, context_.get(), fp8_.get(), moe_.get());
}

template <class Backend>
void Gpt<Backend>::fill_rope_table() {
  rope_ = arena_->get<float>(h_rope_);
  const ModelShape& s = layout_.canonical.shape;
  // Row t of the table is local token t's: under context parallelism its true position's.
  const int Tl = max_n_ / max_batch_, T = Tl * cp_size_, hs = block_.width().hs;
  std::vector<float> full(size_t(T) * size_t(hs)), table(size_t(Tl) * size_t(hs));
  cpu::rope_table(full.data(), T, hs, s.rope_theta);
  for (int t = 0; t < Tl; ++t) {
    const int at = cp_size_ > 1 ? context_position(t, Tl, cp_size_, cp_rank_) : t;
    std::copy(full.begin() + long(at) * hs, full.begin() + long(at + 1) * hs,
              table.begin() + long(t) * hs);
  }
  Backend::to_device(rope_, table.data(), table.size() * sizeof(float));
}

template <class Backend>
const typename Backend::Act* Gpt<Backend>::output(int slot) const {
  const int L = end_ - begin_;
  return L > 0 ? act(kOut, slot, L - 1) : act(kEncoded, slot);
}

template <class Backend>
std::vector<std::pair<size_t, size_t>> Gpt<Backend>::tp_partial_gradients(int l) const {
  std::vector<std::pair<size_t, size_t>> out;
  const LocalLayout& lay = layout_;
  auto add = [&](int tensor) {
    if (tensor < 0) return;
    const LocalTensor& t = lay.tensors[size_t(tensor)];
    out.emplace_back(t.offset, t.offset + t.numel);
  };
  // q_norm and k_norm (adjacent: one range) see this rank's heads, under sequence parallelism or
  // not.
  if (l >= 0 && lay.tp > 1 && lay.canonical.has(l, kQkNormW)) {
    const LocalTensor& q = lay.tensors[size_t(lay.layer(l, kQkNormW))];
    out.emplace_back(q.offset, q.offset + 2 * q.numel);
  }
  if (!options_.sequence_parallel) return out;
  if (l < 0) {
    add(lay.norm_weight);
    add(lay.norm_bias);
  } else {
    for (LayerRole r : {kNorm1W, kNorm1B, kNorm2W, kNorm2B})
      if (lay.canonical.has(l, r)) add(lay.layer(l, r));
    // Whole experts: each tp rank routes its own rows, so the router's gradient is partial too.
    if (lay.experts_whole && lay.canonical.has(l, kRouterW)) add(lay.layer(l, kRouterW));
  }
  return out;
}

template <class Backend>
typename TransformerBlock<Backend>::Acts Gpt<Backend>::layer_acts(int slot, int i,
                                                                  bool recomputing) const {
  auto A = [&](Slot k) { return kept(k) ? act(k, slot, i) : work(k); };
  auto S = [&](Stat k) { return kept(k) ? stat(k, slot, i) : work(k); };
  typename Blk::Acts a;
  a.in = i == 0 ? act(kEncoded, slot) : act(kOut, slot, i - 1);
  a.norm1 = A(kNorm1), a.qkv = A(kQkv), a.att = A(kAtt), a.atty = A(kAttY);
  a.attproj = A(kAttProj), a.res2 = A(kRes2), a.norm2 = A(kNorm2), a.fc1 = A(kFc1);
  a.mlp_act = A(kMlpAct), a.fc2 = A(kFc2);
  a.out = recomputing ? work(kOut) : act(kOut, slot, i);
  a.norm1_mean = S(kNorm1Mean), a.norm1_rstd = S(kNorm1Rstd), a.norm2_mean = S(kNorm2Mean);
  a.norm2_rstd = S(kNorm2Rstd), a.lse = S(kAttLse);
  const bool qk = layout_.canonical.shape.qk_norm;
  a.qk_raw = qk ? A(kQkRaw) : nullptr;
  a.qk_rstd = qk ? S(kQkRstd) : nullptr;
  a.doc_start = docs_[size_t(slot)].start;
  a.slot = slot;
  a.recomputing = recomputing;
  return a;
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
                          int B, int T, const int32_t* doc_pos) {
  const LocalLayout& lay = layout_;
  const int C = n_embd();
  // Positions in the document name their rows themselves, under context parallelism too.
  if (!context_ || doc_pos) {
    Backend::encoder_forward(out, tokens, embed, positions, B, T, C, lay.vocab_begin,
                             lay.vocab_rows, doc_pos);
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
                                   const int32_t* tokens, int B, int T, const int32_t* doc_pos) {
  const LocalLayout& lay = layout_;
  const int C = n_embd();
  if (!context_ || doc_pos) {
    Backend::encoder_backward(dembed, dpositions, dout, tokens, B, T, C, lay.vocab_begin,
                              lay.vocab_rows, doc_pos);
    return;
  }
  each_chunk(B, T, [&](size_t at, size_t pos, int Tc) {
    Backend::encoder_backward(dembed, dpositions ? dpositions + pos * C : dpositions,
                              dout + at * C, tokens + at, 1, Tc, C, lay.vocab_begin,
                              lay.vocab_rows);
  });
}

template <class Backend>
std::vector<int> Gpt<Backend>::pass_units(bool forward) const {
  const LocalLayout& lay = layout_;
  std::vector<int> in, layers, out;
  if (first_) {
    in.push_back(unit(lay.embed));
    if (lay.positions >= 0) in.push_back(unit(lay.positions));
  }
  for (int l = begin_; l < end_; ++l) {
    layers.push_back(lay.layer_unit(l));
    if (lay.expert_unit(l) >= 0) layers.push_back(lay.expert_unit(l));
  }
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
    for (int l = end_ - 1; l >= begin_; --l) {
      back.push_back(lay.layer_unit(l));
      if (lay.expert_unit(l) >= 0) back.push_back(lay.expert_unit(l));
    }
    return back;
  }
  in.insert(in.end(), layers.begin(), layers.end());
  in.insert(in.end(), out.begin(), out.end());
  return in;
}

template <class Backend>
void Gpt<Backend>::forward(Weights<Act>& weights, int slot, const int32_t* tokens,
                           const int32_t* targets, float* losses, int B, int T,
                           DocumentIds docs) {
  const LocalLayout& lay = layout_;
  docs_[size_t(slot)] = docs;
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
    Act* partial = options_.sequence_parallel ? scratch(Blk::kPartial) : act(kEncoded, slot);
    const Act* embed = P(lay.embed);
    const Act* positions = P(lay.positions);
    encode(partial, tokens, embed, lay.tp_rank == 0 ? positions : none, B, T, docs.pos);
    done(lay.embed);
    done(lay.positions);
    block_.reduce_rows(partial, act(kEncoded, slot), N);
  }
  for (int l = begin_; l < end_; ++l) {
    const int u = lay.layer_unit(l), e = lay.expert_unit(l);
    typename Blk::LayerUnits w;
    w.params = weights.params(u);
    w.codes = weights.codes(u);
    if (e >= 0) w.expert_params = weights.params(e);
    block_.forward(w, l, layer_acts(slot, l - begin_, false), B, T);
    weights.params_done(u);
    if (e >= 0) weights.params_done(e);
  }
  if (!last_) return;

  const Act* norm_weight = P(lay.norm_weight);
  const Act* norm_bias = P(lay.norm_bias);
  block_.norm_forward(act(kNormF, slot), stat(kNormFMean, slot), stat(kNormFRstd, slot),
                      output(slot), norm_weight, norm_bias, Nr);
  done(lay.norm_weight);
  done(lay.norm_bias);
  // Vocab-parallel head over this rank's rows (head_columns(): the real ones, or with the
  // padding where the backend wants aligned GEMMs; the cross-entropy reads the real ones).
  const int Vh = head_columns(), Vl = lay.vocab_valid();
  Act* logits = act(kLogits, slot);
  block_.linear_forward(Fp8State::kHead, 0, logits,
                        block_.gather_rows(act(kNormF, slot), scratch(Blk::kGather), N),
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
  Act* dres = scratch(Blk::kDRes);
  // The objective weighs this micro-batch's mean loss by dloss times its tokens (all cp ranks').
  block_.set_loss_weight(double(dloss) * N * cp_size_);

  if (last_) {
    // The probabilities become their own gradient in place: probs - onehot, scaled (0 on the
    // padding columns, so the padding rows of the head get no gradient).
    const int Vh = head_columns(), Vl = lay.vocab_valid();
    Act* dlogits = act(kLogits, slot);
    Backend::crossentropy_backward(dlogits, dlogits, targets_ + size_t(slot) * max_n_, dloss, N,
                                   Vh, Vl, lay.vocab_begin);
    zero(scratch(Blk::kDNorm), size_t(N) * C);
    const Act* head = P(lay.head);
    block_.linear_backward(Fp8State::kHead, 0, scratch(Blk::kDNorm), G(lay.head), no_grad,
                           dlogits,
                           block_.gather_rows(act(kNormF, slot), scratch(Blk::kGather), N),
                           head, N, C, Vh);
    done(lay.head, true);
    const Act* dnormf = block_.reduce_rows(scratch(Blk::kDNorm), scratch(Blk::kDNormRows), N);
    zero(dres, size_t(Nr) * C);
    const Act* norm_weight = P(lay.norm_weight);
    block_.norm_backward(dres, G(lay.norm_weight), G(lay.norm_bias), dnormf, output(slot),
                         norm_weight, stat(kNormFMean, slot), stat(kNormFRstd, slot), Nr);
    done(lay.norm_weight, true);
    done(lay.norm_bias, false);
  }
  for (int l = end_ - 1; l >= begin_; --l) {
    const int i = l - begin_, u = lay.layer_unit(l), e = lay.expert_unit(l);
    typename Blk::LayerUnits w;
    w.params = weights.params(u);
    w.codes = weights.codes(u);
    w.grads = weights.grads(u);
    if (e >= 0) {
      w.expert_params = weights.params(e);
      w.expert_grads = weights.grads(e);
    }
    if (options_.recompute == Recompute::Full) {
      // Rerun the layer's forward from its kept input, then its backward reads what it wrote.
      const typename Blk::Acts a = layer_acts(slot, i, true);
      block_.forward(w, l, a, B, T);
      block_.backward(w, l, a, B, T);
    } else {
      const typename Blk::Acts a = layer_acts(slot, i, false);
      if (options_.recompute == Recompute::Selective) block_.attention_core(a, B, T);
      block_.backward(w, l, a, B, T);
    }
    weights.params_done(u);
    weights.grads_done(u);
    if (e >= 0) {
      weights.params_done(e);
      weights.grads_done(e);
    }
    if (layer_done) layer_done(l);
  }
  if (first_) {
    encode_backward(G(lay.embed), G(lay.positions),
                    block_.gather_rows(dres, scratch(Blk::kDFull), N), tokens, B, T,
                    docs_[size_t(slot)].pos);
    done(lay.embed, false);
    done(lay.positions, false);
  }
}

template class Gpt<CpuBackend>;
// Declarations only (`tessera plan`, backend/declare.hpp).
template Gpt<DeclareBackend<float>>::Gpt(const LocalLayout&, Comm*, int, int, int, Arena&, const ModelOptions&, int, Comm*, Comm*);
template Gpt<DeclareBackend<Bf16Bytes>>::Gpt(const LocalLayout&, Comm*, int, int, int, Arena&, const ModelOptions&, int, Comm*, Comm*);
#ifdef TESSERA_CUDA
template class Gpt<CudaBackend<float>>;
template class Gpt<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
