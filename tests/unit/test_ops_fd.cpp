// The CPU op set against finite differences (double), naive references, and itself (float vs
// double, repeated calls, thread counts).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.hpp"

namespace {

using namespace tessera::cpu;
using Vec = std::vector<double>;

constexpr double kStep = 1e-6;  // central-difference step
constexpr double kTol = 1e-6;   // max relative error, analytic vs numeric gradient
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

std::vector<int32_t> random_ints(size_t n, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> u(0, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = u(rng);
  return v;
}

double rel_err(double a, double n) {
  return std::fabs(a - n) / std::max(1e-8, std::fabs(a) + std::fabs(n));
}

// Σ w ⊙ out, kept in long double: rounding the loss to double would add ulp(L)/2h ~ 1e-9 of noise
// to every numeric gradient, more than 1e-6 relative for the small components.
long double weighted_sum(const Vec& w, const Vec& out) {
  long double s = 0.0L;
  for (size_t i = 0; i < w.size(); i++) s += (long double)w[i] * out[i];
  return s;
}

// Largest relative error between grad and central differences of loss() over every element of x.
// The step actually taken, (x+h)-(x-h), divides, not 2h, which x's rounding would make inexact.
double fd_max_error(Vec& x, const Vec& grad, const std::function<long double()>& loss) {
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i], xp = x0 + kStep, xm = x0 - kStep;
    x[i] = xp;
    const long double lp = loss();
    x[i] = xm;
    const long double lm = loss();
    x[i] = x0;
    worst = std::max(worst, rel_err(grad[i], (double)((lp - lm) / (xp - xm))));
  }
  return worst;
}

// A backward that accumulates turns a pre-filled buffer `pre` into pre + grad.
void expect_accumulates(const Vec& pre, const Vec& after, const Vec& grad, const std::string& what) {
  ASSERT_EQ(pre.size(), after.size());
  double worst = 0.0;
  for (size_t i = 0; i < pre.size(); i++)
    worst = std::max(worst, std::fabs(after[i] - (pre[i] + grad[i])) / (1.0 + std::fabs(pre[i] + grad[i])));
  EXPECT_LE(worst, 1e-13) << what << " does not accumulate into its gradient buffer";
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// ---------------------------------------------------------------------------------------------
// gemm

template <typename F>
void check_gemm_all_transposes(double tol) {
  std::mt19937_64 rng(11);
  const int M = 7, N = 5, K = 9;
  const F alpha = F(0.75), beta = F(-1.25);
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      // stored shapes: A is (M,K) or (K,M); B is (K,N) or (N,K); leading dims padded by 3
      const int a_rows = ta ? K : M, a_cols = ta ? M : K;
      const int b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 4;
      Vec a = random_vec((size_t)a_rows * lda, rng), b = random_vec((size_t)b_rows * ldb, rng);
      Vec c = random_vec((size_t)M * ldc, rng);
      std::vector<F> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(c.begin(), c.end());
      gemm<F>(ta, tb, M, N, K, alpha, af.data(), lda, bf.data(), ldb, beta, cf.data(), ldc);
      for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
          const double got = cf[(size_t)i * ldc + j];
          if (j >= N) {  // padding between rows is never written
            EXPECT_EQ(got, (double)F(c[(size_t)i * ldc + j]));
            continue;
          }
          double ref = 0.0;
          for (int k = 0; k < K; k++) {
            const double aik = ta ? (double)af[(size_t)k * lda + i] : (double)af[(size_t)i * lda + k];
            const double bkj = tb ? (double)bf[(size_t)j * ldb + k] : (double)bf[(size_t)k * ldb + j];
            ref += aik * bkj;
          }
          ref = (double)alpha * ref + (double)beta * (double)F(c[(size_t)i * ldc + j]);
          EXPECT_NEAR(got, ref, tol) << "trans_a=" << ta << " trans_b=" << tb << " at " << i << "," << j;
        }
      }
    }
  }
}

TEST(CpuOps, GemmMatchesNaiveForAllTransposesAndLeadingDims) {
  check_gemm_all_transposes<double>(1e-13);
  check_gemm_all_transposes<float>(1e-5);
}

TEST(CpuOps, GemmWithBetaZeroIgnoresOldC) {
  const double a[2] = {1.0, 2.0}, b[2] = {3.0, 4.0};
  double c[4] = {kNaN, kNaN, kNaN, kNaN};
  gemm<double>(false, false, 2, 2, 1, 1.0, a, 1, b, 2, 0.0, c, 2);  // outer product (2,1)·(1,2)
  EXPECT_EQ(c[0], 3.0);
  EXPECT_EQ(c[1], 4.0);
  EXPECT_EQ(c[2], 6.0);
  EXPECT_EQ(c[3], 8.0);

  // K = 0: an empty product, only the beta scaling is left (BLAS itself would reject lda = 0)
  gemm<double>(false, false, 2, 2, 0, 1.0, a, 1, b, 2, 2.0, c, 2);
  EXPECT_EQ(c[0], 6.0);
  EXPECT_EQ(c[3], 16.0);
  c[1] = kNaN;
  gemm<double>(false, false, 2, 2, 0, 1.0, a, 1, b, 2, 0.0, c, 2);
  for (double v : c) EXPECT_EQ(v, 0.0);
}

// ---------------------------------------------------------------------------------------------
// encoder

TEST(CpuOps, EncoderForwardAndGradients) {
  const int B = 2, T = 5, C = 12, V = 11;
  std::mt19937_64 rng(1);
  std::vector<int32_t> tokens = random_ints((size_t)B * T, V, rng);
  tokens[7] = tokens[2];  // repeated tokens are the case a racy backward gets wrong
  tokens[9] = tokens[2];
  Vec wte = random_vec((size_t)V * C, rng), wpe = random_vec((size_t)T * C, rng);
  Vec w = random_vec((size_t)B * T * C, rng), out((size_t)B * T * C, kNaN);

  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C; c++)
      EXPECT_EQ(out[(size_t)bt * C + c], wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)(bt % T) * C + c]);

  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
    return weighted_sum(w, out);
  };
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C, 0, V);
  EXPECT_LE(fd_max_error(wte, dwte, loss), kTol);
  EXPECT_LE(fd_max_error(wpe, dwpe, loss), kTol);

  const Vec pre_wte = random_vec(wte.size(), rng), pre_wpe = random_vec(wpe.size(), rng);
  Vec acc_wte = pre_wte, acc_wpe = pre_wpe;
  encoder_backward(acc_wte.data(), acc_wpe.data(), w.data(), tokens.data(), B, T, C, 0, V);
  expect_accumulates(pre_wte, acc_wte, dwte, "encoder dwte");
  expect_accumulates(pre_wpe, acc_wpe, dwpe, "encoder dwpe");
}

// data.document_mask: each token reads the wpe row of its position in its document; rows repeat
// (every document's first token reads row 0), and the gradient sums them all.
TEST(CpuOps, EncoderDocumentPositions) {
  const int B = 2, T = 7, C = 6, V = 9;
  std::mt19937_64 rng(3);
  const std::vector<int32_t> tokens = random_ints((size_t)B * T, V, rng);
  const std::vector<int32_t> pos = {0, 1, 2, 0, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4};
  Vec wte = random_vec((size_t)V * C, rng), wpe = random_vec((size_t)T * C, rng);
  Vec w = random_vec((size_t)B * T * C, rng), out((size_t)B * T * C, kNaN);
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V, pos.data());
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C; c++)
      EXPECT_EQ(out[(size_t)bt * C + c],
                wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)pos[bt] * C + c]);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V, pos.data());
    return weighted_sum(w, out);
  };
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C, 0, V, pos.data());
  EXPECT_LE(fd_max_error(wte, dwte, loss), kTol);
  EXPECT_LE(fd_max_error(wpe, dwpe, loss), kTol);
  for (int c = 0; c < C; c++) EXPECT_EQ(dwpe[(size_t)6 * C + c], 0.0);  // no token at position 6
}

TEST(CpuOps, EncoderVocabShardsSumToTheWhole) {
  // Tensor parallel splits wte by rows: rank r holds [v0, v0 + vcount), adds wpe only once, and
  // the sum of the ranks' outputs (an all-reduce) is the unsplit result; each rank's dwte is its
  // rows of the unsplit gradient and dwpe is whole on every rank that asks for it.
  const int B = 2, T = 5, C = 8, V = 12;
  std::mt19937_64 rng(11);
  std::vector<int32_t> tokens = random_ints((size_t)B * T, V, rng);
  Vec wte = random_vec((size_t)V * C, rng), wpe = random_vec((size_t)T * C, rng);
  Vec dout = random_vec((size_t)B * T * C, rng);
  Vec whole((size_t)B * T * C), dwte_whole(wte.size(), 0.0), dwpe_whole(wpe.size(), 0.0);
  encoder_forward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
  encoder_backward(dwte_whole.data(), dwpe_whole.data(), dout.data(), tokens.data(), B, T, C, 0, V);
  Vec sum(whole.size(), 0.0);
  for (int r = 0; r < 3; r++) {
    const int v0 = r * 4;
    Vec part(whole.size()), dwte((size_t)4 * C, 0.0), dwpe(wpe.size(), 0.0);
    encoder_forward(part.data(), tokens.data(), wte.data() + (size_t)v0 * C,
                    r == 0 ? wpe.data() : nullptr, B, T, C, v0, 4);
    for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
    encoder_backward(dwte.data(), r == 1 ? dwpe.data() : nullptr, dout.data(), tokens.data(), B,
                     T, C, v0, 4);
    for (size_t i = 0; i < dwte.size(); i++) EXPECT_EQ(dwte[i], dwte_whole[(size_t)v0 * C + i]);
    if (r == 1) {
      EXPECT_EQ(dwpe, dwpe_whole);
    }
  }
  EXPECT_EQ(sum, whole);
}

// ---------------------------------------------------------------------------------------------
// layernorm

TEST(CpuOps, LayernormForwardAndGradients) {
  const int N = 10, C = 12;
  std::mt19937_64 rng(2);
  Vec inp = random_vec((size_t)N * C, rng, 1.0, 4.0);  // a non-zero mean, as in a residual stream
  Vec weight = random_vec(C, rng, 0.5, 1.5), bias = random_vec(C, rng);
  Vec w = random_vec((size_t)N * C, rng);
  Vec out((size_t)N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);

  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  for (int n = 0; n < N; n++) {
    long double m = 0.0L, v = 0.0L;
    for (int c = 0; c < C; c++) m += inp[(size_t)n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (inp[(size_t)n * C + c] - m) * (inp[(size_t)n * C + c] - m);
    v /= C;  // biased variance, as torch.nn.LayerNorm
    const long double s = 1.0L / std::sqrt(v + 1e-5L);
    EXPECT_NEAR(mean[n], (double)m, 1e-14);
    EXPECT_NEAR(rstd[n], (double)s, 1e-12);
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[(size_t)n * C + c],
                  (double)((inp[(size_t)n * C + c] - m) * s * weight[c] + bias[c]), 1e-12);
  }

  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return weighted_sum(w, out);
  };
  loss();
  Vec dinp(inp.size(), 0.0), dweight(C, 0.0), dbias(C, 0.0);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  EXPECT_LE(fd_max_error(inp, dinp, loss), kTol);
  EXPECT_LE(fd_max_error(weight, dweight, loss), kTol);
  EXPECT_LE(fd_max_error(bias, dbias, loss), kTol);

  loss();  // restore mean, rstd of the unperturbed input
  const Vec pre_inp = random_vec(dinp.size(), rng), pre_w = random_vec(C, rng), pre_b = random_vec(C, rng);
  Vec acc_inp = pre_inp, acc_w = pre_w, acc_b = pre_b;
  layernorm_backward(acc_inp.data(), acc_w.data(), acc_b.data(), w.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), N, C);
  expect_accumulates(pre_inp, acc_inp, dinp, "layernorm dinp");
  expect_accumulates(pre_w, acc_w, dweight, "layernorm dweight");
  expect_accumulates(pre_b, acc_b, dbias, "layernorm dbias");
}

// ---------------------------------------------------------------------------------------------
// matmul

TEST(CpuOps, MatmulForwardAndGradients) {
  const int N = 10, IC = 12, OC = 7;
  std::mt19937_64 rng(3);
  Vec inp = random_vec((size_t)N * IC, rng), weight = random_vec((size_t)OC * IC, rng);
  Vec bias = random_vec(OC, rng), w = random_vec((size_t)N * OC, rng);
  Vec out((size_t)N * OC, kNaN), out_nb((size_t)N * OC, kNaN);

  matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, IC, OC);
  matmul_forward(out_nb.data(), inp.data(), weight.data(), (const double*)nullptr, N, IC, OC);
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      double ref = 0.0;
      for (int i = 0; i < IC; i++) ref += inp[(size_t)n * IC + i] * weight[(size_t)o * IC + i];
      EXPECT_NEAR(out_nb[(size_t)n * OC + o], ref, 1e-13);
      EXPECT_NEAR(out[(size_t)n * OC + o], ref + bias[o], 1e-13);
    }
  }

  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, IC, OC);
    return weighted_sum(w, out);
  };
  Vec dinp(inp.size(), 0.0), dweight(weight.size(), 0.0), dbias(OC, 0.0);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N, IC, OC);
  EXPECT_LE(fd_max_error(inp, dinp, loss), kTol);
  EXPECT_LE(fd_max_error(weight, dweight, loss), kTol);
  EXPECT_LE(fd_max_error(bias, dbias, loss), kTol);

  const Vec pre_inp = random_vec(dinp.size(), rng), pre_w = random_vec(dweight.size(), rng);
  const Vec pre_b = random_vec(OC, rng);
  Vec acc_inp = pre_inp, acc_w = pre_w, acc_b = pre_b;
  matmul_backward(acc_inp.data(), acc_w.data(), acc_b.data(), w.data(), inp.data(), weight.data(), N, IC, OC);
  expect_accumulates(pre_inp, acc_inp, dinp, "matmul dinp");
  expect_accumulates(pre_w, acc_w, dweight, "matmul dweight");
  expect_accumulates(pre_b, acc_b, dbias, "matmul dbias");

  // dinp and dbias skipped: dweight alone, unchanged
  Vec only_w(weight.size(), 0.0);
  matmul_backward((double*)nullptr, only_w.data(), (double*)nullptr, w.data(), inp.data(), weight.data(),
                  N, IC, OC);
  EXPECT_EQ(only_w, dweight);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

TEST(CpuOps, RmsnormForwardAndGradients) {
  const int N = 10, C = 12;
  const double eps = 1e-6;
  std::mt19937_64 rng(13);
  Vec inp = random_vec((size_t)N * C, rng, -2.0, 3.0), weight = random_vec(C, rng, 0.5, 1.5);
  Vec w = random_vec((size_t)N * C, rng);
  Vec out((size_t)N * C, kNaN), rstd(N, kNaN);

  rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
  for (int n = 0; n < N; n++) {
    long double ms = 0.0L;
    for (int c = 0; c < C; c++) ms += (long double)inp[(size_t)n * C + c] * inp[(size_t)n * C + c];
    const long double s = 1.0L / std::sqrt(ms / C + (long double)eps);
    EXPECT_NEAR(rstd[n], (double)s, 1e-14 * (double)s);
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[(size_t)n * C + c], (double)(inp[(size_t)n * C + c] * s * weight[c]), 1e-14);
  }

  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
    return weighted_sum(w, out);
  };
  loss();
  Vec dinp(inp.size(), 0.0), dweight(C, 0.0);
  rmsnorm_backward(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), rstd.data(), N, C);
  EXPECT_LE(fd_max_error(inp, dinp, loss), kTol);
  EXPECT_LE(fd_max_error(weight, dweight, loss), kTol);

  loss();  // restore rstd of the unperturbed input
  const Vec pre_inp = random_vec(dinp.size(), rng), pre_w = random_vec(C, rng);
  Vec acc_inp = pre_inp, acc_w = pre_w;
  rmsnorm_backward(acc_inp.data(), acc_w.data(), w.data(), inp.data(), weight.data(), rstd.data(), N, C);
  expect_accumulates(pre_inp, acc_inp, dinp, "rmsnorm dinp");
  expect_accumulates(pre_w, acc_w, dweight, "rmsnorm dweight");
}

// ---------------------------------------------------------------------------------------------
// attention and rope: qkv (B,T,(NH+2*NKV)*hs), q heads, then k heads, then v heads

// Element e of head h of part `part` (q = 0, k = 1, v = 2) at (b,t) in qkv.
struct QkvIndex {
  int T, NH, NKV, hs;
  size_t operator()(int b, int t, int part, int h, int e) const {
    const int head = part == 0 ? h : part == 1 ? NH + h : NH + NKV + h;
    return ((size_t)b * T + t) * (NH + 2 * NKV) * hs + (size_t)head * hs + e;
  }
};

void rope_case(int B, int T, int NH, int NKV, int hs, double theta, uint64_t seed) {
  SCOPED_TRACE("rope B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
               std::to_string(NH) + " NKV=" + std::to_string(NKV) + " hs=" + std::to_string(hs));
  std::mt19937_64 rng(seed);
  const QkvIndex at{T, NH, NKV, hs};
  const int half = hs / 2;
  std::vector<float> cs((size_t)T * half * 2, std::numeric_limits<float>::quiet_NaN());
  rope_table(cs.data(), T, hs, theta);
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < half; i++) {
      const long double a = t * std::pow((long double)theta, -2.0L * i / hs);
      EXPECT_NEAR(cs[((size_t)t * half + i) * 2], (double)std::cos(a), 1e-7);
      EXPECT_NEAR(cs[((size_t)t * half + i) * 2 + 1], (double)std::sin(a), 1e-7);
    }
  }

  Vec qkv = random_vec((size_t)B * T * (NH + 2 * NKV) * hs, rng), w = random_vec(qkv.size(), rng);
  Vec y = qkv;
  rope_forward(y.data(), cs.data(), B, T, NH, NKV, hs);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int part = 0; part < 3; part++) {
        for (int h = 0; h < (part == 0 ? NH : NKV); h++) {
          for (int i = 0; i < half; i++) {
            const size_t lo = at(b, t, part, h, i), hi = at(b, t, part, h, i + half);
            if (part == 2) {  // v is not rotated
              EXPECT_EQ(y[lo], qkv[lo]);
              EXPECT_EQ(y[hi], qkv[hi]);
              continue;
            }
            const long double c = cs[((size_t)t * half + i) * 2], sn = cs[((size_t)t * half + i) * 2 + 1];
            EXPECT_NEAR(y[lo], (double)(qkv[lo] * c - qkv[hi] * sn), 1e-15);
            EXPECT_NEAR(y[hi], (double)(qkv[hi] * c + qkv[lo] * sn), 1e-15);
          }
        }
      }
    }
  }

  // rope_backward turns d(rotated) into d(input) in place.
  auto loss = [&] {
    y = qkv;
    rope_forward(y.data(), cs.data(), B, T, NH, NKV, hs);
    return weighted_sum(w, y);
  };
  Vec grad = w;
  rope_backward(grad.data(), cs.data(), B, T, NH, NKV, hs);
  EXPECT_LE(fd_max_error(qkv, grad, loss), kTol);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NKV; h++)
        for (int e = 0; e < hs; e++) EXPECT_EQ(grad[at(b, t, 2, h, e)], w[at(b, t, 2, h, e)]);
}

TEST(CpuOps, RopeForwardAndGradients) {
  rope_case(2, 5, 4, 2, 6, 100.0, 14);   // grouped-query
  rope_case(1, 7, 3, 3, 8, 10000.0, 15);  // multi-head
  rope_case(2, 4, 4, 1, 2, 500000.0, 16);  // one kv head, the smallest even head size
}

// model.qk_norm: each q and k head of qkv RMS-normalised in place by its half of the weight
// (2 hs: q's, then k's), the heads before it kept in raw; the v heads untouched. The backward
// replaces d(normalised) by d(raw) in place and accumulates the weight's gradient.
void qk_norm_case(int N, int NH, int NKV, int hs, uint64_t seed) {
  SCOPED_TRACE("qk_norm N=" + std::to_string(N) + " NH=" + std::to_string(NH) + " NKV=" +
               std::to_string(NKV) + " hs=" + std::to_string(hs));
  const double eps = 1e-6;
  std::mt19937_64 rng(seed);
  const int heads = NH + NKV;
  const size_t row = (size_t)(NH + 2 * NKV) * hs;
  Vec qkv = random_vec((size_t)N * row, rng, -2.0, 3.0), weight = random_vec(2 * (size_t)hs, rng, 0.5, 1.5);
  const Vec w = random_vec(qkv.size(), rng);
  Vec y = qkv, raw((size_t)N * heads * hs, kNaN), rstd((size_t)N * heads, kNaN);
  qk_norm_forward(y.data(), raw.data(), rstd.data(), weight.data(), N, NH, NKV, hs, eps);
  for (int n = 0; n < N; n++) {
    for (int j = 0; j < NH + 2 * NKV; j++) {
      const size_t at = n * row + (size_t)j * hs;
      if (j >= heads) {  // a v head
        for (int c = 0; c < hs; c++) EXPECT_EQ(y[at + c], qkv[at + c]);
        continue;
      }
      long double ms = 0.0L;
      for (int c = 0; c < hs; c++) ms += (long double)qkv[at + c] * qkv[at + c];
      const long double s = 1.0L / std::sqrt(ms / hs + (long double)eps);
      EXPECT_NEAR(rstd[(size_t)n * heads + j], (double)s, 1e-14 * (double)s);
      const double* wj = weight.data() + (j < NH ? 0 : hs);
      for (int c = 0; c < hs; c++) {
        EXPECT_EQ(raw[((size_t)n * heads + j) * hs + c], qkv[at + c]);
        EXPECT_NEAR(y[at + c], (double)(qkv[at + c] * s * wj[c]), 1e-13);
      }
    }
  }

  auto loss = [&] {
    y = qkv;
    qk_norm_forward(y.data(), raw.data(), rstd.data(), weight.data(), N, NH, NKV, hs, eps);
    return weighted_sum(w, y);
  };
  loss();
  Vec grad = w, dweight(2 * (size_t)hs, 0.0);
  qk_norm_backward(grad.data(), dweight.data(), raw.data(), weight.data(), rstd.data(), N, NH, NKV, hs);
  EXPECT_LE(fd_max_error(qkv, grad, loss), kTol);
  EXPECT_LE(fd_max_error(weight, dweight, loss), kTol);
  for (int n = 0; n < N; n++)  // the v heads' gradient passes untouched
    for (size_t e = (size_t)heads * hs; e < row; e++) EXPECT_EQ(grad[n * row + e], w[n * row + e]);

  loss();
  const Vec pre = random_vec(dweight.size(), rng);
  Vec acc = pre, again = w;
  qk_norm_backward(again.data(), acc.data(), raw.data(), weight.data(), rstd.data(), N, NH, NKV, hs);
  expect_accumulates(pre, acc, dweight, "qk_norm dweight");
  EXPECT_TRUE(again == grad) << "qk_norm's d(raw) is not the same on a second call";
}

TEST(CpuOps, QkNormForwardAndGradients) {
  qk_norm_case(6, 4, 2, 8, 21);   // grouped-query
  qk_norm_case(5, 3, 3, 6, 22);   // multi-head
  qk_norm_case(3, 2, 1, 70, 23);  // one kv head, the head past one 64-wide column block
}

// Straightforward causal grouped-query attention and its backward in long double, one (b,h) and
// one query row at a time: the values the blocked products must reproduce. dqkv accumulates
// like the op's.
void reference_attention(Vec& out, Vec& dqkv, const Vec& qkv, const Vec& dout, int B, int T,
                         int NH, int NKV, int hs) {
  const long double scale = 1.0L / std::sqrt((long double)hs);
  const QkvIndex at{T, NH, NKV, hs};
  const int Cq = NH * hs;
  out.assign((size_t)B * T * Cq, 0.0);
  dqkv.assign(qkv.size(), 0.0);
  std::vector<long double> acc(qkv.size(), 0.0L);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / NKV);
      for (int i = 0; i < T; i++) {
        std::vector<long double> p(i + 1), dp(i + 1);
        long double mx = -1e300L, sum = 0.0L, dot = 0.0L;
        for (int j = 0; j <= i; j++) {
          long double s = 0.0L;
          for (int e = 0; e < hs; e++) s += (long double)qkv[at(b, i, 0, h, e)] * qkv[at(b, j, 1, g, e)];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= i; j++) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= i; j++) p[j] /= sum;
        for (int e = 0; e < hs; e++) {
          long double o = 0.0L;
          for (int j = 0; j <= i; j++) o += p[j] * qkv[at(b, j, 2, g, e)];
          out[((size_t)b * T + i) * Cq + h * hs + e] = (double)o;
        }
        const double* d = dout.data() + ((size_t)b * T + i) * Cq + h * hs;
        for (int j = 0; j <= i; j++) {
          long double s = 0.0L;
          for (int e = 0; e < hs; e++) s += (long double)d[e] * qkv[at(b, j, 2, g, e)];
          dp[j] = s;
          dot += p[j] * s;
        }
        for (int j = 0; j <= i; j++) {
          const long double ds = p[j] * (dp[j] - dot) * scale;  // d(pre-softmax score) · scale
          for (int e = 0; e < hs; e++) {
            acc[at(b, i, 0, h, e)] += ds * qkv[at(b, j, 1, g, e)];
            acc[at(b, j, 1, g, e)] += ds * qkv[at(b, i, 0, h, e)];
            acc[at(b, j, 2, g, e)] += p[j] * d[e];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < acc.size(); i++) dqkv[i] = (double)acc[i];
}

std::string attention_shape(const char* what, int B, int T, int NH, int NKV, int hs) {
  return std::string(what) + " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" +
         std::to_string(NH) + " NKV=" + std::to_string(NKV) + " hs=" + std::to_string(hs);
}

// Finite differences check the math on small T; the long-double reference checks the blocked
// products for any T, where the double-precision differences get too noisy for 1e-6.
void check_attention(int B, int T, int NH, int NKV, int hs, uint64_t seed, bool finite_differences) {
  SCOPED_TRACE(attention_shape("gemm", B, T, NH, NKV, hs));
  std::mt19937_64 rng(seed);
  const size_t n_out = (size_t)B * T * NH * hs;
  Vec qkv = random_vec((size_t)B * T * (NH + 2 * NKV) * hs, rng, -1.5, 1.5), w = random_vec(n_out, rng);
  Vec out(n_out, kNaN), att((size_t)B * NH * T * T, kNaN), ref_out, ref_dqkv;

  attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NKV, hs);
  reference_attention(ref_out, ref_dqkv, qkv, w, B, T, NH, NKV, hs);
  EXPECT_LE(max_abs_diff(out, ref_out), 1e-13);
  for (int bh = 0; bh < B * NH; bh++) {
    for (int i = 0; i < T; i++) {
      const double* row = att.data() + ((size_t)bh * T + i) * T;
      double sum = 0.0;
      for (int j = 0; j <= i; j++) sum += row[j];
      EXPECT_NEAR(sum, 1.0, 1e-14);
      for (int j = i + 1; j < T; j++) ASSERT_EQ(row[j], 0.0) << "att not causal at row " << i << " col " << j;
    }
  }

  Vec dqkv(qkv.size(), 0.0), datt(att.size(), kNaN);  // scratch: its old contents must not matter
  attention_backward(dqkv.data(), datt.data(), w.data(), qkv.data(), att.data(), B, T, NH, NKV, hs);
  EXPECT_LE(max_abs_diff(dqkv, ref_dqkv), 1e-13);

  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NKV, hs);
    return weighted_sum(w, out);
  };
  if (finite_differences) {
    EXPECT_LE(fd_max_error(qkv, dqkv, loss), kTol);
  }

  loss();
  const Vec pre = random_vec(dqkv.size(), rng);
  Vec acc = pre;
  std::fill(datt.begin(), datt.end(), kNaN);
  attention_backward(acc.data(), datt.data(), w.data(), qkv.data(), att.data(), B, T, NH, NKV, hs);
  expect_accumulates(pre, acc, dqkv, "attention dqkv");
}

TEST(CpuOps, AttentionForwardAndGradients) { check_attention(2, 5, 2, 2, 6, 4, true); }

// T past two row blocks (64) and not a multiple of one: the blocked causal products must still
// cover every (query, key) pair below the diagonal.
TEST(CpuOps, AttentionForwardAndGradientsAcrossRowBlocks) { check_attention(2, 150, 3, 3, 4, 5, false); }

// Grouped-query (two query heads per kv head) and multi-query (one kv head for all): each kv
// head's dk and dv sum over its query heads.
TEST(CpuOps, GroupedQueryAttentionForwardAndGradients) {
  check_attention(2, 5, 4, 2, 3, 17, true);
  check_attention(2, 5, 4, 1, 3, 18, true);
  check_attention(1, 150, 4, 2, 4, 19, false);
}

// The fused attention (model.attention: fused) against the same long-double reference, its
// log-sum-exp against the row's own, and its gradient against finite differences: the backward
// recomputes the probabilities from q, k and lse alone, and reads the forward's out.
void check_fused_attention(int B, int T, int NH, int NKV, int hs, uint64_t seed,
                           bool finite_differences) {
  SCOPED_TRACE(attention_shape("fused", B, T, NH, NKV, hs));
  std::mt19937_64 rng(seed);
  const QkvIndex at{T, NH, NKV, hs};
  const size_t n_out = (size_t)B * T * NH * hs;
  Vec qkv = random_vec((size_t)B * T * (NH + 2 * NKV) * hs, rng, -1.5, 1.5), w = random_vec(n_out, rng);
  Vec out(n_out, kNaN), lse((size_t)B * NH * T, kNaN), ref_out, ref_dqkv;
  attention_fused_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, hs);
  reference_attention(ref_out, ref_dqkv, qkv, w, B, T, NH, NKV, hs);
  EXPECT_LE(max_abs_diff(out, ref_out), 1e-13);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / NKV);
      for (int i = 0; i < T; i++) {
        long double sum = 0.0L;
        for (int j = 0; j <= i; j++) {
          long double s = 0.0L;
          for (int e = 0; e < hs; e++) s += (long double)qkv[at(b, i, 0, h, e)] * qkv[at(b, j, 1, g, e)];
          sum += std::exp(s / std::sqrt((long double)hs));
        }
        EXPECT_NEAR(lse[((size_t)b * NH + h) * T + i], (double)std::log(sum), 1e-13);
      }
    }
  }
  Vec dqkv(qkv.size(), 0.0);
  attention_fused_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, hs);
  EXPECT_LE(max_abs_diff(dqkv, ref_dqkv), 1e-13);
  if (finite_differences) {
    auto loss = [&] {
      attention_fused_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, hs);
      return weighted_sum(w, out);
    };
    EXPECT_LE(fd_max_error(qkv, dqkv, loss), kTol);
    attention_fused_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, hs);
  }
  const Vec pre = random_vec(dqkv.size(), rng);
  Vec acc = pre;
  attention_fused_backward(acc.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, hs);
  expect_accumulates(pre, acc, dqkv, "fused attention dqkv");
}

TEST(CpuOps, FusedAttentionForwardAndGradients) { check_fused_attention(2, 5, 2, 2, 6, 6, true); }
TEST(CpuOps, FusedAttentionAcrossRowBlocks) { check_fused_attention(2, 150, 3, 3, 4, 7, false); }
TEST(CpuOps, FusedGroupedQueryAttentionForwardAndGradients) {
  check_fused_attention(2, 5, 4, 2, 3, 20, true);
  check_fused_attention(2, 5, 4, 1, 3, 21, true);
  check_fused_attention(1, 150, 4, 2, 4, 22, false);
}

// ---------------------------------------------------------------------------------------------
// gelu, residual

TEST(CpuOps, GeluForwardMatchesTorchAndGradients) {
  const Vec x = {-3.0, -0.5, 0.0, 1.0, 2.5};
  // torch.nn.functional.gelu(x, approximate='tanh') in float64
  const Vec torch_ref = {-0.0036373920817729943, -0.15428599017485606, 0.0, 0.8411919906082768,
                         2.484915733910001};
  Vec y(x.size(), kNaN);
  gelu_forward(y.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(y[i], torch_ref[i], 1e-15);

  std::mt19937_64 rng(6);
  const size_t n = 37;
  Vec inp = random_vec(n, rng, -4.0, 4.0), w = random_vec(n, rng), out(n, kNaN);
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return weighted_sum(w, out);
  };
  Vec dinp(n, 0.0);
  gelu_backward(dinp.data(), inp.data(), w.data(), n);
  EXPECT_LE(fd_max_error(inp, dinp, loss), kTol);

  const Vec pre = random_vec(n, rng);
  Vec acc = pre;
  gelu_backward(acc.data(), inp.data(), w.data(), n);
  expect_accumulates(pre, acc, dinp, "gelu dinp");
}

// silu(gate) * up against long double, and both halves of its gradient against finite
// differences, gates in the tails included (exp(-g) huge or tiny).
TEST(CpuOps, SwigluForwardAndGradients) {
  const int N = 7, H = 9;
  std::mt19937_64 rng(23);
  Vec inp = random_vec((size_t)N * 2 * H, rng, -4.0, 4.0), w = random_vec((size_t)N * H, rng);
  inp[0] = -80.0;
  inp[1] = 80.0;
  Vec out((size_t)N * H, kNaN);
  swiglu_forward(out.data(), inp.data(), N, H);
  for (int n = 0; n < N; n++) {
    for (int j = 0; j < H; j++) {
      const long double g = inp[(size_t)n * 2 * H + j], u = inp[(size_t)n * 2 * H + H + j];
      EXPECT_NEAR(out[(size_t)n * H + j], (double)(g / (1.0L + std::exp(-g)) * u), 1e-14);
    }
  }

  auto loss = [&] {
    swiglu_forward(out.data(), inp.data(), N, H);
    return weighted_sum(w, out);
  };
  Vec dinp(inp.size(), 0.0);
  swiglu_backward(dinp.data(), inp.data(), w.data(), N, H);
  EXPECT_LE(fd_max_error(inp, dinp, loss), kTol);

  const Vec pre = random_vec(dinp.size(), rng);
  Vec acc = pre;
  swiglu_backward(acc.data(), inp.data(), w.data(), N, H);
  expect_accumulates(pre, acc, dinp, "swiglu dinp");

  // Gates far past the range of exp in float: finite, with silu's limits (0 and g).
  const std::vector<float> big = {-1000.0f, 1000.0f, 2.0f, 3.0f};  // one row: gates, then ups
  std::vector<float> y(2), dy = {1.0f, 1.0f}, dbig(4, 0.0f);
  swiglu_forward(y.data(), big.data(), 1, 2);
  swiglu_backward(dbig.data(), big.data(), dy.data(), 1, 2);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 3000.0f);
  const std::vector<float> want = {0.0f, 3.0f, 0.0f, 1000.0f};  // d(gate) = up silu', d(up) = silu
  for (int i = 0; i < 4; i++) EXPECT_EQ(dbig[i], want[i]) << "element " << i;
}

TEST(CpuOps, ResidualAndAddInplace) {
  std::mt19937_64 rng(7);
  const size_t n = 1001;
  const Vec a = random_vec(n, rng), b = random_vec(n, rng);
  Vec out(n, kNaN), dst = a;
  residual_forward(out.data(), a.data(), b.data(), n);
  add_inplace(dst.data(), b.data(), n);
  for (size_t i = 0; i < n; i++) {
    EXPECT_EQ(out[i], a[i] + b[i]);
    EXPECT_EQ(dst[i], a[i] + b[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// crossentropy

// The whole vocabulary on one rank: the three passes with no reduction between them.
template <typename F>
void crossentropy_whole(F* losses, F* probs, const F* logits, const int32_t* targets, int N, int V,
                        int Vp) {
  std::vector<F> row_max(N);
  std::vector<double> sums(2 * (size_t)N);
  crossentropy_row_max(row_max.data(), logits, N, Vp, V);
  crossentropy_exp_sums(sums.data(), probs, logits, row_max.data(), targets, N, Vp, V, 0);
  crossentropy_finish(losses, probs, sums.data(), N, Vp, V);
}

TEST(CpuOps, CrossentropyForwardAndGradients) {
  const int N = 10, V = 11, Vp = 16;
  const double dloss = 0.37;
  std::mt19937_64 rng(8);
  Vec logits = random_vec((size_t)N * Vp, rng, -3.0, 3.0);
  const std::vector<int32_t> targets = random_ints(N, V, rng);
  Vec probs((size_t)N * Vp, kNaN), losses(N, kNaN);

  crossentropy_whole(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
  for (int n = 0; n < N; n++) {
    const double* x = logits.data() + (size_t)n * Vp;
    long double sum = 0.0L;
    for (int v = 0; v < V; v++) sum += std::exp((long double)x[v]);
    for (int v = 0; v < V; v++)
      EXPECT_NEAR(probs[(size_t)n * Vp + v], (double)(std::exp((long double)x[v]) / sum), 1e-15);
    for (int v = V; v < Vp; v++) EXPECT_EQ(probs[(size_t)n * Vp + v], 0.0);
    EXPECT_NEAR(losses[n], (double)(std::log(sum) - x[targets[n]]), 1e-14);
  }

  auto loss = [&] {
    crossentropy_whole(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
    long double s = 0.0L;
    for (double l : losses) s += (long double)l * dloss;
    return s;
  };
  loss();
  Vec dlogits(logits.size(), kNaN);  // overwritten, not accumulated
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, Vp, V, 0);
  EXPECT_LE(fd_max_error(logits, dlogits, loss), kTol);  // padded columns: both exactly 0
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) EXPECT_EQ(dlogits[(size_t)n * Vp + v], 0.0);
}

TEST(CpuOps, CrossentropyIgnoresPaddingAndWorksInPlace) {
  const int N = 10, V = 11, Vp = 16;
  std::mt19937_64 rng(9);
  const Vec logits = random_vec((size_t)N * Vp, rng, -3.0, 3.0);
  const std::vector<int32_t> targets = random_ints(N, V, rng);
  Vec probs((size_t)N * Vp), losses(N), dlogits((size_t)N * Vp);
  crossentropy_whole(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 0.25, N, Vp, V, 0);

  // Padded logits hold whatever the GEMM left there: huge, NaN; nothing may change.
  Vec padded = logits;
  for (int n = 0; n < N; n++) {
    padded[(size_t)n * Vp + V] = 1e30;
    padded[(size_t)n * Vp + Vp - 1] = kNaN;
  }
  Vec probs2((size_t)N * Vp), losses2(N);
  crossentropy_whole(losses2.data(), probs2.data(), padded.data(), targets.data(), N, V, Vp);
  EXPECT_EQ(probs2, probs);
  EXPECT_EQ(losses2, losses);

  // In place: probs over the logits, then dlogits over the probs.
  Vec inplace = logits, losses3(N);
  crossentropy_whole(losses3.data(), inplace.data(), inplace.data(), targets.data(), N, V, Vp);
  EXPECT_EQ(inplace, probs);
  EXPECT_EQ(losses3, losses);
  crossentropy_backward(inplace.data(), inplace.data(), targets.data(), 0.25, N, Vp, V, 0);
  EXPECT_EQ(inplace, dlogits);
}

TEST(CpuOps, CrossentropyVocabShardsMatchTheWhole) {
  // Three ranks of 6 columns over a vocabulary of 14 real ids (18 padded): reducing max and sums
  // between the passes gives the unsplit losses, probabilities and gradients.
  const int N = 7, V = 14, Vp = 18, R = 3, Vl = Vp / R;
  std::mt19937_64 rng(12);
  const Vec logits = random_vec((size_t)N * Vp, rng, -3.0, 3.0);
  const std::vector<int32_t> targets = random_ints(N, V, rng);
  Vec probs((size_t)N * Vp), losses(N), dlogits((size_t)N * Vp);
  crossentropy_whole(losses.data(), probs.data(), logits.data(), targets.data(), N, V, Vp);
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 0.5, N, Vp, V, 0);

  std::vector<Vec> shard(R, Vec((size_t)N * Vl));
  Vec row_max(N, -1e300), part(N);
  std::vector<double> sums(2 * (size_t)N, 0.0), part_sums(2 * (size_t)N);
  auto valid = [&](int r) { return std::clamp(V - r * Vl, 0, Vl); };
  for (int r = 0; r < R; r++) {
    for (int n = 0; n < N; n++)
      for (int v = 0; v < Vl; v++) shard[r][(size_t)n * Vl + v] = logits[(size_t)n * Vp + r * Vl + v];
    crossentropy_row_max(part.data(), shard[r].data(), N, Vl, valid(r));
    for (int n = 0; n < N; n++) row_max[n] = std::max(row_max[n], part[n]);
  }
  for (int r = 0; r < R; r++) {
    crossentropy_exp_sums(part_sums.data(), shard[r].data(), shard[r].data(), row_max.data(),
                          targets.data(), N, Vl, valid(r), r * Vl);
    for (size_t i = 0; i < sums.size(); i++) sums[i] += part_sums[i];
  }
  for (int r = 0; r < R; r++) {
    Vec shard_losses(N);
    crossentropy_finish(shard_losses.data(), shard[r].data(), sums.data(), N, Vl, valid(r));
    for (int n = 0; n < N; n++) EXPECT_NEAR(shard_losses[n], losses[n], 1e-14);
    crossentropy_backward(shard[r].data(), shard[r].data(), targets.data(), 0.5, N, Vl, valid(r),
                          r * Vl);
    for (int n = 0; n < N; n++)
      for (int v = 0; v < Vl; v++)
        EXPECT_NEAR(shard[r][(size_t)n * Vl + v], dlogits[(size_t)n * Vp + r * Vl + v], 1e-15);
  }
}

// ---------------------------------------------------------------------------------------------
// every op at once: float vs double, repeated calls, thread counts

// Shapes past the 64-wide column and row blocks, none a power of two. The attention runs twice:
// multi-head (NH heads of C/NH) and grouped-query (GQ_NH query heads of C/GQ_NH, GQ_NKV kv heads,
// the layout RoPE rotates too).
struct OpInputs {
  int B = 2, T = 70, C = 96, NH = 3, V = 101, Vp = 128, OC = 200, GQ_NH = 4, GQ_NKV = 2;
  std::vector<int32_t> tokens, targets;
  Vec wte, wpe, x, ln_w, ln_b, mm_w, mm_b, qkv, dout_c, dout_oc, gelu_in, logits, gq_qkv, dout_h;

  OpInputs() {
    std::mt19937_64 rng(10);
    const size_t N = (size_t)B * T;
    tokens = random_ints(N, V, rng);
    targets = random_ints(N, V, rng);
    wte = random_vec((size_t)V * C, rng);
    wpe = random_vec((size_t)T * C, rng);
    x = random_vec(N * C, rng, -2.0, 3.0);
    ln_w = random_vec(C, rng, 0.5, 1.5);
    ln_b = random_vec(C, rng);
    mm_w = random_vec((size_t)OC * C, rng, -0.2, 0.2);
    mm_b = random_vec(OC, rng);
    qkv = random_vec(N * 3 * C, rng, -0.5, 0.5);
    dout_c = random_vec(N * C, rng);
    dout_oc = random_vec(N * OC, rng);
    gelu_in = random_vec(N * OC, rng, -4.0, 4.0);
    logits = random_vec(N * Vp, rng, -4.0, 4.0);
    gq_qkv = random_vec(N * (GQ_NH + 2 * GQ_NKV) * (C / GQ_NH), rng, -0.5, 0.5);
    dout_h = random_vec(N * OC / 2, rng);
  }
};

using Results = std::vector<std::pair<std::string, Vec>>;

template <typename F>
std::vector<F> to(const Vec& v) { return std::vector<F>(v.begin(), v.end()); }

// Runs every forward and backward on the inputs cast to F; returns each output, widened to double.
template <typename F>
Results run_all_ops(const OpInputs& in, bool include_blas = true) {
  const int B = in.B, T = in.T, C = in.C, NH = in.NH, V = in.V, Vp = in.Vp, OC = in.OC, N = B * T;
  Results r;
  auto keep = [&r](const std::string& name, const std::vector<F>& v) {
    r.emplace_back(name, Vec(v.begin(), v.end()));
  };

  const std::vector<F> wte = to<F>(in.wte), wpe = to<F>(in.wpe), x = to<F>(in.x), ln_w = to<F>(in.ln_w);
  const std::vector<F> ln_b = to<F>(in.ln_b), mm_w = to<F>(in.mm_w), mm_b = to<F>(in.mm_b);
  const std::vector<F> qkv = to<F>(in.qkv);
  const std::vector<F> dout_c = to<F>(in.dout_c), dout_oc = to<F>(in.dout_oc), gelu_in = to<F>(in.gelu_in);

  std::vector<F> enc((size_t)N * C), dwte((size_t)V * C, F(0)), dwpe((size_t)T * C, F(0));
  encoder_forward(enc.data(), in.tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
  encoder_backward(dwte.data(), dwpe.data(), dout_c.data(), in.tokens.data(), B, T, C, 0, V);
  keep("encoder.out", enc), keep("encoder.dwte", dwte), keep("encoder.dwpe", dwpe);

  std::vector<F> ln((size_t)N * C), mean(N), rstd(N), dln((size_t)N * C, F(0)), dlw(C, F(0)), dlb(C, F(0));
  layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), ln_w.data(), ln_b.data(), N, C);
  layernorm_backward(dln.data(), dlw.data(), dlb.data(), dout_c.data(), x.data(), ln_w.data(), mean.data(),
                     rstd.data(), N, C);
  keep("layernorm.out", ln), keep("layernorm.mean", mean), keep("layernorm.rstd", rstd);
  keep("layernorm.dinp", dln), keep("layernorm.dweight", dlw), keep("layernorm.dbias", dlb);

  std::vector<F> rms((size_t)N * C), rrstd(N), drms((size_t)N * C, F(0)), drw(C, F(0));
  rmsnorm_forward(rms.data(), rrstd.data(), x.data(), ln_w.data(), N, C, 1e-5);
  rmsnorm_backward(drms.data(), drw.data(), dout_c.data(), x.data(), ln_w.data(), rrstd.data(), N, C);
  keep("rmsnorm.out", rms), keep("rmsnorm.rstd", rrstd), keep("rmsnorm.dinp", drms);
  keep("rmsnorm.dweight", drw);

  const int gq_hs = C / in.GQ_NH;
  std::vector<float> cs((size_t)T * gq_hs);
  rope_table(cs.data(), T, gq_hs, 10000.0);
  std::vector<F> rope = to<F>(in.gq_qkv), drope = to<F>(in.gq_qkv);
  rope_forward(rope.data(), cs.data(), B, T, in.GQ_NH, in.GQ_NKV, gq_hs);
  rope_backward(drope.data(), cs.data(), B, T, in.GQ_NH, in.GQ_NKV, gq_hs);
  keep("rope.forward", rope), keep("rope.backward", drope);

  std::vector<F> qkn = to<F>(in.gq_qkv), dqkn = to<F>(in.gq_qkv), qk_w(2 * (size_t)gq_hs);
  std::vector<F> qk_raw((size_t)N * (in.GQ_NH + in.GQ_NKV) * gq_hs);
  std::vector<F> qk_rstd((size_t)N * (in.GQ_NH + in.GQ_NKV)), dqk_w(qk_w.size(), F(0));
  for (size_t i = 0; i < qk_w.size(); i++) qk_w[i] = ln_w[i];
  qk_norm_forward(qkn.data(), qk_raw.data(), qk_rstd.data(), qk_w.data(), N, in.GQ_NH, in.GQ_NKV,
                  gq_hs, 1e-6);
  qk_norm_backward(dqkn.data(), dqk_w.data(), qk_raw.data(), qk_w.data(), qk_rstd.data(), N,
                   in.GQ_NH, in.GQ_NKV, gq_hs);
  keep("qk_norm.forward", qkn), keep("qk_norm.rstd", qk_rstd), keep("qk_norm.backward", dqkn);
  keep("qk_norm.dweight", dqk_w);

  std::vector<F> g((size_t)N * OC), dg((size_t)N * OC, F(0)), res((size_t)N * OC), acc = gelu_in;
  gelu_forward(g.data(), gelu_in.data(), g.size());
  gelu_backward(dg.data(), gelu_in.data(), dout_oc.data(), dg.size());
  residual_forward(res.data(), g.data(), dout_oc.data(), res.size());
  add_inplace(acc.data(), dout_oc.data(), acc.size());
  keep("gelu.out", g), keep("gelu.dinp", dg), keep("residual.out", res), keep("add_inplace.dst", acc);

  const std::vector<F> dout_h = to<F>(in.dout_h);
  std::vector<F> sw((size_t)N * OC / 2), dsw((size_t)N * OC, F(0));
  swiglu_forward(sw.data(), gelu_in.data(), N, OC / 2);
  swiglu_backward(dsw.data(), gelu_in.data(), dout_h.data(), N, OC / 2);
  keep("swiglu.out", sw), keep("swiglu.dinp", dsw);

  std::vector<F> logits = to<F>(in.logits), losses(N), probs((size_t)N * Vp), dlogits((size_t)N * Vp);
  crossentropy_whole(losses.data(), probs.data(), logits.data(), in.targets.data(), N, V, Vp);
  crossentropy_backward(dlogits.data(), probs.data(), in.targets.data(), F(1.0 / N), N, Vp, V, 0);
  keep("crossentropy.losses", losses), keep("crossentropy.probs", probs);
  keep("crossentropy.dlogits", dlogits);

  if (!include_blas) return r;

  std::vector<F> mm((size_t)N * OC), dmi((size_t)N * C, F(0)), dmw((size_t)OC * C, F(0)), dmb(OC, F(0));
  matmul_forward(mm.data(), x.data(), mm_w.data(), mm_b.data(), N, C, OC);
  matmul_backward(dmi.data(), dmw.data(), dmb.data(), dout_oc.data(), x.data(), mm_w.data(), N, C, OC);
  keep("matmul.out", mm), keep("matmul.dinp", dmi), keep("matmul.dweight", dmw), keep("matmul.dbias", dmb);

  std::vector<F> att((size_t)B * NH * T * T), ao((size_t)N * C), dqkv((size_t)N * 3 * C, F(0));
  std::vector<F> datt(att.size());
  attention_forward(ao.data(), att.data(), qkv.data(), B, T, NH, NH, C / NH);
  attention_backward(dqkv.data(), datt.data(), dout_c.data(), qkv.data(), att.data(), B, T, NH, NH,
                     C / NH);
  keep("attention.out", ao), keep("attention.att", att), keep("attention.dqkv", dqkv);

  std::vector<F> fo((size_t)N * C), lse((size_t)B * NH * T), fdqkv((size_t)N * 3 * C, F(0));
  attention_fused_forward(fo.data(), lse.data(), qkv.data(), B, T, NH, NH, C / NH);
  attention_fused_backward(fdqkv.data(), dout_c.data(), qkv.data(), fo.data(), lse.data(), B, T,
                           NH, NH, C / NH);
  keep("attention_fused.out", fo), keep("attention_fused.lse", lse);
  keep("attention_fused.dqkv", fdqkv);

  // Grouped-query, both attentions, on the rotated q and k.
  const int GH = in.GQ_NH, GK = in.GQ_NKV;
  std::vector<F> gatt((size_t)B * GH * T * T), gdatt(gatt.size()), go((size_t)N * C);
  std::vector<F> gdqkv(rope.size(), F(0)), gfo((size_t)N * C), glse((size_t)B * GH * T);
  std::vector<F> gfdqkv(rope.size(), F(0));
  attention_forward(go.data(), gatt.data(), rope.data(), B, T, GH, GK, gq_hs);
  attention_backward(gdqkv.data(), gdatt.data(), dout_c.data(), rope.data(), gatt.data(), B, T, GH,
                     GK, gq_hs);
  attention_fused_forward(gfo.data(), glse.data(), rope.data(), B, T, GH, GK, gq_hs);
  attention_fused_backward(gfdqkv.data(), dout_c.data(), rope.data(), gfo.data(), glse.data(), B,
                           T, GH, GK, gq_hs);
  keep("gqa_attention.out", go), keep("gqa_attention.att", gatt), keep("gqa_attention.dqkv", gdqkv);
  keep("gqa_attention_fused.out", gfo), keep("gqa_attention_fused.lse", glse);
  keep("gqa_attention_fused.dqkv", gfdqkv);
  return r;
}

TEST(CpuOps, FloatAndDoubleAgree) {
  const OpInputs in;
  const Results d = run_all_ops<double>(in), f = run_all_ops<float>(in);
  ASSERT_EQ(d.size(), f.size());
  for (size_t i = 0; i < d.size(); i++) {
    double scale = 1.0;
    for (double v : d[i].second) scale = std::max(scale, std::fabs(v));
    EXPECT_LE(max_abs_diff(f[i].second, d[i].second) / scale, 1e-5) << d[i].first;
  }
}

TEST(CpuOps, BitIdenticalAcrossCalls) {
  const OpInputs in;
  const Results a = run_all_ops<float>(in), b = run_all_ops<float>(in);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_TRUE(a[i].second == b[i].second) << a[i].first;
}

// The non-BLAS ops never split a sum across threads, so they do not even depend on the thread count.
TEST(CpuOps, NonBlasOpsIndependentOfThreadCount) {
  const OpInputs in;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Results one = run_all_ops<float>(in, false);
  omp_set_num_threads(3);
  const Results three = run_all_ops<float>(in, false);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); i++) EXPECT_TRUE(one[i].second == three[i].second) << one[i].first;
}

}  // namespace
