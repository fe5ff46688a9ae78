#include "model/context_attention.hpp"

#include <limits>

#include "backend/cpu/backend.hpp"
#include "backend/declare.hpp"
#include "parallel/comm.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

namespace {
// Tags of the ring's transfers on the cp communicator (MPI's; NCCL matches by order).
constexpr int kTagKv = 1, kTagDkv = 2;
}  // namespace

template <class Backend>
ContextAttention<Backend>::ContextAttention(Comm* cp, bool allgather, int max_batch, int Tl,
                                            int nh, int nkv, int hs, Arena& arena)
    : cp_(cp), allgather_(allgather), arena_(&arena), P_(cp->size()), r_(cp->rank()), Tl_(Tl),
      nh_(nh), nkv_(nkv), hs_(hs), max_batch_(max_batch) {
  block_ = size_t(max_batch) * Tl * 2 * nkv * hs;
  // Ring: the block in hand and the one coming; the dK/dV of this rank's own block, and of the
  // one in hand and the one coming. Allgather: every rank's.
  h_kv_ = arena.add("context-parallel K/V blocks", size_t(allgather ? P_ : 2) * block_ * sizeof(Act));
  h_dkv_ = arena.add("context-parallel dK/dV blocks",
                     size_t(allgather ? P_ : 3) * block_ * sizeof(Act));
  h_delta_ = arena.add("context-parallel attention delta",
                       size_t(max_batch) * nh * Tl * sizeof(float));
}

template <class Backend>
void ContextAttention<Backend>::bind() {
  kv_ = arena_->get<Act>(h_kv_);
  dkv_ = arena_->get<Act>(h_dkv_);
  delta_ = arena_->get<float>(h_delta_);
}

// The K/V columns of qkv's rows, packed into a block / its gradient added back: one op each, so
// on a GPU the rows are not copied one by one.
template <class Backend>
void ContextAttention<Backend>::pack(Act* kv, const Act* qkv, int B) const {
  const size_t C3 = size_t(nh_ + 2 * nkv_) * hs_, W = size_t(2 * nkv_) * hs_;
  Backend::copy_columns(kv, W, qkv + size_t(nh_) * hs_, C3, size_t(B) * Tl_, W);
}

template <class Backend>
void ContextAttention<Backend>::unpack_add(Act* dqkv, const Act* dkv, int B) const {
  const size_t C3 = size_t(nh_ + 2 * nkv_) * hs_, W = size_t(2 * nkv_) * hs_;
  Backend::add_columns(dqkv + size_t(nh_) * hs_, C3, dkv, W, size_t(B) * Tl_, W);
}

// Query half qh holds chunk r (qh 0) or 2P-1-r (qh 1); key half kh of source src likewise. f(q, k,
// s) for each block at or below the causal diagonal: q and k the first rows of its query and key
// halves (of Tl), s its shape (leading dimensions s.ldq, s.ldo, s.ldkv) and, under a document
// mask, the query half's document starts.
template <class Backend>
template <class F>
void ContextAttention<Backend>::each_block(int src, int B, const int32_t* doc_start, F f) const {
  const int Tc = Tl_ / 2, C3 = (nh_ + 2 * nkv_) * hs_, Cq = nh_ * hs_, W = 2 * nkv_ * hs_;
  for (int qh = 0; qh < 2; ++qh) {
    const int cq = qh == 0 ? r_ : 2 * P_ - 1 - r_;
    for (int kh = 0; kh < 2; ++kh) {
      const int ck = kh == 0 ? src : 2 * P_ - 1 - src;
      if (ck > cq) continue;  // wholly above the causal diagonal
      const AttentionBlock s{B, Tc, nh_, nkv_, hs_, C3, Cq, W, Tl_,
                             size_t(Tl_) * C3, size_t(Tl_) * Cq, size_t(Tl_) * W, ck == cq,
                             doc_start ? doc_start + size_t(qh) * Tc : nullptr, size_t(Tl_),
                             ck * Tc};
      f(size_t(qh) * Tc, size_t(kh) * Tc, s);
    }
  }
}

template <class Backend>
void ContextAttention<Backend>::blocks_forward(Act* out, float* lse, const Act* qkv, const Act* kv,
                                               int src, int B, const int32_t* doc_start) const {
  each_block(src, B, doc_start, [&](size_t q, size_t k, const AttentionBlock& s) {
    Backend::attention_block_forward(out + q * s.ldo, lse + q, qkv + q * s.ldq, kv + k * s.ldkv, s);
  });
}

template <class Backend>
void ContextAttention<Backend>::blocks_backward(Act* dqkv, Act* dkv, const Act* dout,
                                                const Act* qkv, const Act* kv, const float* lse,
                                                int src, int B,
                                                const int32_t* doc_start) const {
  each_block(src, B, doc_start, [&](size_t q, size_t k, const AttentionBlock& s) {
    Backend::attention_block_backward(dqkv + q * s.ldq, dkv + k * s.ldkv, dout + q * s.ldo,
                                      delta_ + q, qkv + q * s.ldq, kv + k * s.ldkv, lse + q, s);
  });
}

template <class Backend>
void ContextAttention<Backend>::wait_ring() {
  const double start = trace::now();
  cp_->group_end();
  cp_->wait_sends();
  cp_->busy_seconds += trace::now() - start;
}

template <class Backend>
void ContextAttention<Backend>::forward(Act* out, float* lse, const Act* qkv, int B,
                                        const int32_t* doc_start) {
  const double start = trace::now();
  struct Add {
    double& total;
    double start;
    ~Add() { total += trace::now() - start; }
  } add{seconds, start};
  const size_t n = size_t(B) * Tl_ * 2 * nkv_ * hs_;
  Backend::zero(out, size_t(B) * Tl_ * nh_ * hs_ * sizeof(Act));
  Backend::fill(lse, size_t(B) * nh_ * Tl_, -std::numeric_limits<float>::infinity());
  if (allgather_) {
    pack(kv_ + size_t(r_) * n, qkv, B);
    cp_->all_gather(kv_ + size_t(r_) * n, kv_, n);
    for (int step = 0; step < P_; ++step) {
      const int src = (r_ - step + P_) % P_;
      blocks_forward(out, lse, qkv, kv_ + size_t(src) * n, src, B, doc_start);
    }
    return;
  }
  const int next = (r_ + 1) % P_, prev = (r_ - 1 + P_) % P_;
  pack(kv_, qkv, B);
  for (int step = 0; step < P_; ++step) {
    Act* held = kv_ + size_t(step % 2) * block_;
    Act* coming = kv_ + size_t((step + 1) % 2) * block_;
    const bool pass = step + 1 < P_;
    if (pass) {  // posted before the block in hand is computed
      cp_->group_start();
      cp_->send(held, n, next, kTagKv);
      cp_->recv(coming, n, prev, kTagKv);
    }
    blocks_forward(out, lse, qkv, held, (r_ - step + P_) % P_, B, doc_start);
    if (pass) wait_ring();
  }
}

// The ring's backward: at step s this rank holds source (r - s)'s K/V and the dK/dV sums of the
// ranks between it and the source; the next K/V block is posted before the computation, the sums
// after it. After cp - 1 hops each block's sums are back with its owner: 2 (cp - 1) blocks sent.
template <class Backend>
void ContextAttention<Backend>::backward(Act* dqkv, const Act* dout, const Act* qkv,
                                         const Act* out, const float* lse, int B,
                                         const int32_t* doc_start) {
  struct Add {
    double& total;
    double start;
    ~Add() { total += trace::now() - start; }
  } add{seconds, trace::now()};
  const size_t n = size_t(B) * Tl_ * 2 * nkv_ * hs_;
  Backend::attention_delta(delta_, dout, out, B, Tl_, nh_, hs_, nh_ * hs_);
  if (allgather_) {
    // The K/V of the forward's gather are still in kv_ unless recompute reran another layer:
    // gathered again.
    pack(kv_ + size_t(r_) * n, qkv, B);
    cp_->all_gather(kv_ + size_t(r_) * n, kv_, n);
    Backend::zero(dkv_, size_t(P_) * n * sizeof(Act));
    for (int step = 0; step < P_; ++step) {
      const int src = (r_ - step + P_) % P_;
      blocks_backward(dqkv, dkv_ + size_t(src) * n, dout, qkv, kv_ + size_t(src) * n, lse, src,
                      B, doc_start);
    }
    unpack_add(dqkv, cp_->reduce_scatter_sum_in_place(dkv_, n), B);
    return;
  }
  const int next = (r_ + 1) % P_, prev = (r_ - 1 + P_) % P_;
  pack(kv_, qkv, B);
  // dkv_ block 0: this rank's own contribution to its block; blocks 1 and 2: the sums that
  // travel with the other ranks' blocks, from the rank after the owner round to the owner.
  Backend::zero(dkv_, n * sizeof(Act));
  for (int step = 0; step < P_; ++step) {
    Act* held = kv_ + size_t(step % 2) * block_;
    Act* coming = kv_ + size_t((step + 1) % 2) * block_;
    Act* sums = dkv_ + size_t(step == 0 ? 0 : 1 + step % 2) * block_;
    Act* sums_coming = dkv_ + size_t(1 + (step + 1) % 2) * block_;
    const bool pass = step + 1 < P_;
    if (pass) {  // the next K/V block, posted before this one's computation
      cp_->group_start();
      cp_->send(held, n, next, kTagKv);
      cp_->recv(coming, n, prev, kTagKv);
    }
    if (step == 1) Backend::zero(sums, n * sizeof(Act));
    blocks_backward(dqkv, sums, dout, qkv, held, lse, (r_ - step + P_) % P_, B, doc_start);
    if (pass) wait_ring();
    if (step == 0) continue;
    cp_->group_start();
    cp_->send(sums, n, next, kTagDkv);
    cp_->recv(sums_coming, n, prev, kTagDkv);
    wait_ring();
  }
  unpack_add(dqkv, dkv_, B);
  unpack_add(dqkv, dkv_ + size_t(1 + P_ % 2) * block_, B);
}

template class ContextAttention<CpuBackend>;
template ContextAttention<DeclareBackend<float>>::ContextAttention(Comm*, bool, int, int, int, int,
                                                                   int, Arena&);
template ContextAttention<DeclareBackend<Bf16Bytes>>::ContextAttention(Comm*, bool, int, int, int,
                                                                       int, int, Arena&);
#ifdef TESSERA_CUDA
template class ContextAttention<CudaBackend<float>>;
template class ContextAttention<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
