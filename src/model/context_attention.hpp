#pragma once
// Context parallelism's attention (parallel.cp > 1; docs/parallelism.md): each
// sequence of T tokens is cut into 2 x cp chunks of T / (2 cp) positions, and cp rank r holds
// chunks r and 2 cp - 1 - r (so causal attention work is equal on every rank), its Tl = T / cp
// tokens in that order. The queries of its two chunks attend to every chunk at or before them:
// the key/value heads (only those: with GQA fewer than the query heads) of each cp rank reach the
// others either round a ring (parallel.cp_comm: ring; each block's transfer to the next rank is
// posted before the block in hand is computed, so it overlaps the computation) or all at once
// (allgather). Every (query chunk, key chunk) block merges into the output by its log-sum-exp;
// blocks wholly above the causal diagonal are skipped. The backward passes the key/value blocks
// round again, their dK/dV accumulating on the way back to their owners (allgather: summed by
// one reduce-scatter).
//
// Blocks are taken in the same order on both paths (the ring's), so their forward outputs agree
// to the bit; the dK/dV sums differ in order (ring: rank by rank; allgather: the reduction's).
// Every backend: the blocks are Backend::attention_block_forward / _backward (the CPU's, or the
// CUDA kernels of backend/cuda/attention_block.cu in fp32 or bf16, the log-sum-exps and the
// backward's delta in fp32), the transfers the cp communicator's (MPI, or NCCL queued on the
// stream).
#include <cstdint>
#include <vector>

#include "backend/arena.hpp"

namespace tessera {

// The true position of local token t (of Tl) on cp rank r of cp.
inline int context_position(int t, int Tl, int cp, int r) {
  const int Tc = Tl / 2;
  return t < Tc ? r * Tc + t : (2 * cp - 1 - r) * Tc + (t - Tc);
}

// The payload bytes one layer's attention sends on the cp communicator per micro-batch of B
// sequences (docs/parallelism.md's counting): the ring's forward passes cp - 1 K/V blocks, its
// backward cp - 1 K/V blocks and cp - 1 dK/dV blocks, a block being B * Tl * 2 * nkv * hs
// elements (nkv: this rank's KV heads).
inline double ring_bytes_per_layer(int B, int Tl, int nkv, int hs, int cp, int elem) {
  const double block = double(B) * Tl * 2.0 * nkv * hs * elem;
  return block * 3.0 * (cp - 1);
}

template <class Backend>
class ContextAttention {
 public:
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // cp: the context-parallel communicator (only its size and rank are read here); Tl: the rank's
  // tokens per sequence; nh, nkv, hs: this rank's query heads, key/value heads and head size.
  ContextAttention(Comm* cp, bool allgather, int max_batch, int Tl, int nh, int nkv, int hs,
                   Arena& arena);
  void bind();

  // qkv (B,Tl,(nh+2nkv)hs) of this rank's tokens (in its chunk order, rotated by their true
  // positions); out (B,Tl,nh*hs) and lse (B,nh,Tl) overwritten, as the fused attention's.
  // doc_start (B,Tl) or nullptr (data.document_mask): the true position of each of this rank's
  // tokens' document start (backend/attention_block.hpp's q_start).
  void forward(Act* out, float* lse, const Act* qkv, int B, const int32_t* doc_start);
  // Accumulates dqkv from dout, with the forward's out and lse.
  void backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out, const float* lse,
                int B, const int32_t* doc_start);

  // Seconds spent in forward and backward so far (the attention, its transfers' waits among
  // them); the waits are added to the cp communicator's busy_seconds (the exposed communication).
  // On a GPU both are the host's time queueing the work (NCCL's waits are the stream's, not the
  // host's: NcclComm::busy_seconds stays 0).
  double seconds = 0;

 private:
  // Copies the key/value columns of qkv into kv (B,Tl,2nkv*hs) / adds kv's into dqkv's.
  void pack(Act* kv, const Act* qkv, int B) const;
  // Waits for the ring's posted transfers (group_end, wait_sends), timed as exposed.
  void wait_ring();
  void unpack_add(Act* dqkv, const Act* dkv, int B) const;
  // The blocks of this rank's queries against source rank src's keys (held in kv), forward or
  // backward (dkv: the source's gradient accumulator).
  // f(q, k, s) for each block of this rank's queries against src's keys (context_attention.cpp).
  template <class F>
  void each_block(int src, int B, const int32_t* doc_start, F f) const;
  void blocks_forward(Act* out, float* lse, const Act* qkv, const Act* kv, int src, int B,
                      const int32_t* doc_start) const;
  void blocks_backward(Act* dqkv, Act* dkv, const Act* dout, const Act* qkv, const Act* kv,
                       const float* lse, int src, int B, const int32_t* doc_start) const;

  Comm* cp_;
  bool allgather_;
  Arena* arena_;
  int P_, r_, Tl_, nh_, nkv_, hs_, max_batch_;
  size_t block_ = 0;  // elements of one rank's K/V block (max_batch * Tl * 2 nkv hs)
  size_t h_kv_ = 0, h_dkv_ = 0, h_delta_ = 0;
  Act* kv_ = nullptr;     // ring: two blocks; allgather: cp blocks
  Act* dkv_ = nullptr;    // the same for the gradients
  float* delta_ = nullptr;  // (B, nh, Tl)
};

}  // namespace tessera
