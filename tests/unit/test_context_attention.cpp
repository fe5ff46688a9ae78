// Context parallelism's attention blocks (backend/cpu/attention_block.cpp) against the one-rank
// fused attention (double): every cp rank's two chunks, merged block by block from every source
// rank in the ring's order, give the fused attention's output, log-sum-exp and q, k, v gradients
// at those positions, for cp = 1, 2, 4 and grouped-query heads, with and without a document
// mask.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "model/context_attention.hpp"

namespace {

using namespace tessera::cpu;
using tessera::AttentionBlock;
using Vec = std::vector<double>;

// docs: under a document mask of random documents (1 to 6 tokens: many query rows see no key
// of some blocks).
void check_cp(int P, int B, int T, int NH, int NKV, int hs, bool docs = false) {
  std::mt19937_64 rng(P * 100 + NKV);
  std::uniform_real_distribution<double> u(-1, 1);
  const int C3 = (NH + 2 * NKV) * hs, Cq = NH * hs, W = 2 * NKV * hs, Tl = T / P, Tc = Tl / 2;
  Vec qkv(size_t(B) * T * C3), dout(size_t(B) * T * Cq);
  for (double& x : qkv) x = u(rng);
  for (double& x : dout) x = u(rng);
  Vec start(size_t(B) * T, 0.0);  // document starts, as doubles for local() below
  std::vector<int32_t> start_ids(start.size(), 0);
  if (docs) {
    std::uniform_int_distribution<int> len(1, 6);
    for (int b = 0; b < B; ++b)
      for (int t = 0, at = 0, next = len(rng); t < T; ++t) {
        if (t == next) at = t, next = t + len(rng);
        start[size_t(b) * T + t] = at;
        start_ids[size_t(b) * T + t] = at;
      }
  }
  const int32_t* full_start = docs ? start_ids.data() : nullptr;
  Vec out(size_t(B) * T * Cq), lse(size_t(B) * NH * T), dqkv(qkv.size(), 0.0);
  attention_fused_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, hs, full_start);
  attention_fused_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH,
                           NKV, hs, full_start);
  // Each rank's rows of a (B,T,width) tensor, in its chunk order.
  auto local = [&](const Vec& full, int r, int width) {
    Vec v(size_t(B) * Tl * width);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tl; ++t) {
        const int at = tessera::context_position(t, Tl, P, r);
        for (int c = 0; c < width; ++c)
          v[(size_t(b) * Tl + t) * width + c] = full[(size_t(b) * T + at) * width + c];
      }
    return v;
  };
  std::vector<Vec> lq(P), kv(P), dkv(P, Vec(size_t(B) * Tl * W, 0.0)), ldq(P);
  for (int r = 0; r < P; ++r) {
    lq[r] = local(qkv, r, C3);
    kv[r].resize(size_t(B) * Tl * W);
    for (size_t row = 0; row < size_t(B) * Tl; ++row)
      for (int c = 0; c < W; ++c) kv[r][row * W + c] = lq[r][row * C3 + Cq + c];
    ldq[r].assign(lq[r].size(), 0.0);
  }
  double worst = 0;
  for (int r = 0; r < P; ++r) {
    Vec o(size_t(B) * Tl * Cq, 0.0), l(size_t(B) * NH * Tl, -std::numeric_limits<double>::infinity());
    Vec lout = local(dout, r, Cq);
    const Vec lstart = local(start, r, 1);
    const std::vector<int32_t> lstart_ids(lstart.begin(), lstart.end());
    for (int pass = 0; pass < 2; ++pass) {
      Vec delta(size_t(B) * NH * Tl);
      if (pass == 1) attention_delta(delta.data(), lout.data(), o.data(), B, Tl, NH, hs, Cq);
      for (int step = 0; step < P; ++step) {
        const int src = (r - step + P) % P;
        for (int qh = 0; qh < 2; ++qh)
          for (int kh = 0; kh < 2; ++kh) {
            const int cq = qh ? 2 * P - 1 - r : r, ck = kh ? 2 * P - 1 - src : src;
            if (ck > cq) continue;
            const size_t q = size_t(qh) * Tc, k = size_t(kh) * Tc * W;
            const AttentionBlock s{B, Tc, NH, NKV, hs, C3, Cq, W, Tl, size_t(Tl) * C3,
                                   size_t(Tl) * Cq, size_t(Tl) * W, ck == cq,
                                   docs ? lstart_ids.data() + q : nullptr, size_t(Tl), ck * Tc};
            if (pass == 0)
              attention_block_forward(o.data() + q * Cq, l.data() + q, lq[r].data() + q * C3,
                                      kv[src].data() + k, s);
            else
              attention_block_backward(ldq[r].data() + q * C3, dkv[src].data() + k,
                                       lout.data() + q * Cq, delta.data() + q,
                                       lq[r].data() + q * C3, kv[src].data() + k, l.data() + q, s);
          }
      }
    }
    const Vec want_o = local(out, r, Cq);
    for (size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::abs(o[i] - want_o[i]));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < Tl; ++t) {
          const int at = tessera::context_position(t, Tl, P, r);
          worst = std::max(worst, std::abs(l[(size_t(b) * NH + h) * Tl + t] -
                                           lse[(size_t(b) * NH + h) * T + at]));
        }
  }
  EXPECT_LT(worst, 1e-12) << "forward, cp " << P << (docs ? ", documents" : "");
  // Gradients: q's from each rank, k's and v's summed over the ranks into their owner's rows.
  double gworst = 0;
  for (int r = 0; r < P; ++r) {
    const Vec want = local(dqkv, r, C3);
    for (size_t row = 0; row < size_t(B) * Tl; ++row) {
      for (int c = 0; c < Cq; ++c)
        gworst = std::max(gworst, std::abs(ldq[r][row * C3 + c] - want[row * C3 + c]));
      for (int c = 0; c < W; ++c)
        gworst = std::max(gworst, std::abs(dkv[r][row * W + c] - want[row * C3 + Cq + c]));
    }
  }
  EXPECT_LT(gworst, 1e-12) << "backward, cp " << P << (docs ? ", documents" : "");
}

TEST(ContextAttention, BlocksEqualFusedAttention) {
  for (int P : {1, 2, 4}) {
    check_cp(P, 2, 16, 4, 4, 8);
    check_cp(P, 1, 24, 4, 2, 4);  // grouped-query heads
  }
}

TEST(ContextAttention, BlocksEqualFusedAttentionUnderDocumentMask) {
  for (int P : {1, 2, 4}) {
    check_cp(P, 2, 32, 4, 4, 8, true);
    check_cp(P, 1, 48, 4, 2, 4, true);  // grouped-query heads
  }
}

TEST(ContextAttention, ChunksAreLoadBalanced) {
  // cp = 4, T = 16: rank 1 holds chunks 1 and 6 (positions 2-3 and 12-13).
  const int want[4] = {2, 3, 12, 13};
  for (int t = 0; t < 4; ++t) EXPECT_EQ(tessera::context_position(t, 4, 4, 1), want[t]);
  // Every position is held once.
  std::vector<int> seen(16, 0);
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 4; ++t) seen[size_t(tessera::context_position(t, 4, 4, r))]++;
  for (int n : seen) EXPECT_EQ(n, 1);
}

}  // namespace
