// data.document_mask in the CPU attentions: the gemm and the fused attention's outputs and
// log-sum-exps equal a plain double reference that builds the mask explicitly (key j visible to
// query i iff the i's document start <= j <= i), and their gradients equal central finite
// differences of that reference. Documents of 1 token, documents that start inside a row block
// and one document over the whole window are among the cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "engine/sequences.hpp"

namespace {

using namespace tessera::cpu;
using Vec = std::vector<double>;

struct Shape {
  int B, T, NH, NKV, hs;
  int C3() const { return (NH + 2 * NKV) * hs; }
  int Cq() const { return NH * hs; }
};

// out (B,T,NH*hs) and lse (B,NH,T) of softmax attention over the visible keys, in the plainest
// form: every (b, h, i) row scores every key, hides the masked ones, normalises.
void reference(const Shape& s, const Vec& qkv, const std::vector<int32_t>& start, Vec* out,
               Vec* lse) {
  const int G = s.NH / s.NKV, C3 = s.C3(), Cq = s.Cq();
  out->assign(size_t(s.B) * s.T * Cq, 0.0);
  lse->assign(size_t(s.B) * s.NH * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[(size_t(b) * s.T + i) * C3 + size_t(h) * s.hs];
        std::vector<double> score(size_t(s.T), -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < s.T; ++j) {
          const bool visible = j <= i && j >= start[size_t(b) * s.T + i];
          if (!visible) continue;
          const double* k = &qkv[(size_t(b) * s.T + j) * C3 + size_t(s.NH + h / G) * s.hs];
          double dot = 0;
          for (int c = 0; c < s.hs; ++c) dot += q[c] * k[c];
          score[size_t(j)] = dot / std::sqrt(double(s.hs));
          mx = std::max(mx, score[size_t(j)]);
        }
        double sum = 0;
        for (double x : score) sum += std::exp(x - mx);
        (*lse)[(size_t(b) * s.NH + h) * s.T + i] = mx + std::log(sum);
        double* o = &(*out)[(size_t(b) * s.T + i) * Cq + size_t(h) * s.hs];
        for (int j = 0; j < s.T; ++j) {
          const double p = std::exp(score[size_t(j)] - mx) / sum;
          const double* v = &qkv[(size_t(b) * s.T + j) * C3 + size_t(s.NH + s.NKV + h / G) * s.hs];
          for (int c = 0; c < s.hs; ++c) o[c] += p * v[c];
        }
      }
}

// Document starts of random documents (lengths 1..max_len), restarting in each sequence.
std::vector<int32_t> random_starts(const Shape& s, int max_len, std::mt19937_64& rng) {
  std::vector<int32_t> start(size_t(s.B) * s.T);
  std::uniform_int_distribution<int> len(1, max_len);
  for (int b = 0; b < s.B; ++b) {
    int at = 0, next = len(rng);
    for (int t = 0; t < s.T; ++t) {
      if (t == next) at = t, next = t + len(rng);
      start[size_t(b) * s.T + size_t(t)] = at;
    }
  }
  return start;
}

void check(const Shape& s, const std::vector<int32_t>& start, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Vec qkv(size_t(s.B) * s.T * s.C3()), w(size_t(s.B) * s.T * s.Cq());
  for (double& x : qkv) x = u(rng);
  for (double& x : w) x = u(rng);
  Vec want, want_lse;
  reference(s, qkv, start, &want, &want_lse);

  Vec out(want.size()), att(size_t(s.B) * s.NH * s.T * s.T), lse(want_lse.size());
  Vec fused(want.size());
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.hs, start.data());
  attention_fused_forward(fused.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.hs,
                          start.data());
  double worst = 0, worst_lse = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max({worst, std::abs(out[i] - want[i]), std::abs(fused[i] - want[i])});
  for (size_t i = 0; i < want_lse.size(); ++i)
    worst_lse = std::max(worst_lse, std::abs(lse[i] - want_lse[i]));
  EXPECT_LT(worst, 1e-12) << "forward";
  EXPECT_LT(worst_lse, 1e-12) << "log-sum-exp";

  // Gradients of L = Σ w ∘ out against central differences of the reference.
  Vec datt(att.size()), g_gemm(qkv.size(), 0.0), g_fused(qkv.size(), 0.0);
  attention_backward(g_gemm.data(), datt.data(), w.data(), qkv.data(), att.data(), s.B, s.T, s.NH,
                     s.NKV, s.hs);
  attention_fused_backward(g_fused.data(), w.data(), qkv.data(), fused.data(), lse.data(), s.B, s.T,
                           s.NH, s.NKV, s.hs, start.data());
  auto loss = [&](const Vec& x) {
    Vec o, l;
    reference(s, x, start, &o, &l);
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i) sum += w[i] * o[i];
    return sum;
  };
  const double eps = 1e-5;
  double gworst = 0;
  for (size_t i = 0; i < qkv.size(); ++i) {
    Vec x = qkv;
    x[i] += eps;
    const double up = loss(x);
    x[i] -= 2 * eps;
    const double fd = (up - loss(x)) / (2 * eps);
    gworst = std::max({gworst, std::abs(g_gemm[i] - fd), std::abs(g_fused[i] - fd)});
  }
  EXPECT_LT(gworst, 1e-7) << "gradients";
}

TEST(DocumentMask, AttentionsEqualExplicitMaskAndFiniteDifferences) {
  std::mt19937_64 rng(7);
  const Shape gpt{2, 13, 2, 2, 4}, gqa{1, 70, 4, 2, 4};  // 70 rows: a second row block of 64
  check(gpt, random_starts(gpt, 5, rng), 1);
  check(gqa, random_starts(gqa, 20, rng), 2);
  // One-token documents, and one document over the whole window (plain causal attention).
  std::vector<int32_t> each(size_t(gpt.B) * gpt.T), none(size_t(gpt.B) * gpt.T, 0);
  for (int b = 0; b < gpt.B; ++b)
    for (int t = 0; t < gpt.T; ++t) each[size_t(b) * gpt.T + size_t(t)] = t;
  check(gpt, each, 3);
  check(gpt, none, 4);
}

// No document mask is the causal attention, to the bit.
TEST(DocumentMask, OneDocumentIsTheCausalAttentionBitForBit) {
  const Shape s{2, 33, 4, 2, 8};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> qkv(size_t(s.B) * s.T * s.C3());
  for (float& x : qkv) x = u(rng);
  const std::vector<int32_t> zero(size_t(s.B) * s.T, 0);
  std::vector<float> a(size_t(s.B) * s.T * s.Cq()), b(a.size()), la(size_t(s.B) * s.NH * s.T),
      lb(la.size());
  attention_fused_forward(a.data(), la.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.hs);
  attention_fused_forward(b.data(), lb.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.hs,
                          zero.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
}

// The engine's ids of a micro-batch: a document starts after each eot (eot 9 here), the eot
// itself ending the one before; each sequence starts a document.
TEST(DocumentMask, IdsFromTheEndOfTextTokens) {
  const std::vector<int32_t> inputs = {4, 9, 5, 6, 9, 9, 7, 1,   // sequence 0
                                       9, 3, 3, 3, 3, 3, 9, 2};  // sequence 1
  std::vector<int32_t> start(16), pos(16);
  tessera::document_ids(inputs.data(), 2, 8, 9, start.data(), pos.data());
  EXPECT_EQ(start, (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 6, 6, 0, 1, 1, 1, 1, 1, 1, 7}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 0, 1, 0, 0, 1, 2, 3, 4, 5, 0}));
  // cp = 2, rank 1 holds chunks 1 and 2 of 4 (positions 2-3 and 4-5 of each sequence).
  std::vector<int32_t> mine(8);
  tessera::context_chunks(start.data(), 2, 8, 2, 1, mine.data());
  EXPECT_EQ(mine, (std::vector<int32_t>{2, 2, 2, 5, 1, 1, 1, 1}));
}

}  // namespace
