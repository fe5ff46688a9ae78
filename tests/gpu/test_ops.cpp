// Every CUDA op against its CPU twin on fresh random inputs (the seed is printed at start).
//
// The reference is the CPU op in double on the very values the device holds (inputs are drawn
// already rounded to the device type), so the measured error is the CUDA op's own. The bound is
// max |gpu - cpu| / max |cpu| <= 1e-5 for fp32 and <= 2e-2 for bf16. Outputs an op overwrites
// start as NaN poison (an element it skips fails the test); outputs it accumulates into start
// random (the add is checked too). Shapes are chosen off every block and pack size: odd row
// lengths take the scalar paths, multiples of 8 the 16-byte ones, and an offset of one element
// makes a pointer unaligned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "backend/cpu/ops.hpp"
#include "gpu_test.hpp"
#include "backend/adamw.hpp"

namespace tessera::gpu_test {
namespace {

namespace cpu = tessera::cpu;
namespace gpu = tessera::cuda;

// Element-wise ops of type F: a bf16 output is within 1 ulp of the exact result rounded to
// nearest even, element by element (fp32 outputs: EXPECT_CLOSE's bound).
// `terms`: compare()'s, for ops that add (nullptr for the others).
#define EXPECT_WITHIN_ULP(F, got, want, terms, what)                                             \
  do {                                                                                           \
    const Compare c_ = compare(got, want, terms);                                                \
    const bool bf16_ = std::is_same_v<F, bf16>;                                                  \
    EXPECT_EQ(c_.bf16_values, bf16_) << (what) << ": bf16 values in the output";                 \
    EXPECT_LE(bf16_ ? c_.max_ulps : 0.0, 1.0)                                                    \
        << (what) << ": an element " << c_.max_ulps                                              \
        << " ulp from the reference rounded to nearest even";                                    \
  } while (0)

// Rows [0, rows) and columns [0, cols) of a row-major matrix with leading dimension ld.
std::vector<double> block(const std::vector<double>& m, int rows, int cols, int ld) {
  std::vector<double> out;
  out.reserve(size_t(rows) * cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) out.push_back(m[size_t(r) * ld + c]);
  return out;
}

template <typename F>
class CudaOp : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CudaOp, Types, TypeNames);

TYPED_TEST(CudaOp, Gemm) {
  using F = TypeParam;
  const int M = 37, N = 45, K = 67;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      for (double beta : {0.0, 1.0}) {
        // Leading dimensions wider than the matrices, as the attention's column blocks are.
        const int a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
        const int b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 1;
        const int ldc = N + 2;
        auto A = random_of<F>(size_t(a_rows) * lda), B = random_of<F>(size_t(b_rows) * ldb);
        auto C = random_of<F>(size_t(M) * ldc);
        Dev<F> dA(A), dB(B), dC(C.size());
        if (beta != 0.0) dC.put(C);
        else std::fill(C.begin(), C.end(), std::numeric_limits<double>::quiet_NaN());
        gpu::gemm<F>(ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, float(beta), dC, ldc);
        cpu::gemm<double>(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        EXPECT_CLOSE(block(dC.fetch(), M, N, ldc), block(C, M, N, ldc), tolerance<F>(),
                     "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                         " beta=" + std::to_string(int(beta)));
      }
    }
  }
}

// K = 0 (an LM-head backward on a tensor-parallel rank that holds only padding rows): C = beta C,
// whatever the leading dimension of an operand with no columns (0 here, which cuBLAS refuses).
TYPED_TEST(CudaOp, GemmOverNothing) {
  using F = TypeParam;
  const int M = 37, N = 45, ldc = N + 2;
  for (double beta : {0.0, 0.5, 1.0}) {
    auto C = random_of<F>(size_t(M) * ldc);
    Dev<F> dA(1), dB(static_cast<size_t>(N)), dC(C);
    gpu::gemm<F>(false, false, M, N, 0, 1.0f, dA, 0, dB, N, float(beta), dC, ldc);
    cpu::gemm<double>(false, false, M, N, 0, 1.0, nullptr, 0, nullptr, N, beta, C.data(), ldc);
    EXPECT_CLOSE(block(dC.fetch(), M, N, ldc), block(C, M, N, ldc), 0.0,
                 "gemm K=0 beta=" + std::to_string(beta));
  }
  // The layer it comes from: matmul_backward with OC = 0 leaves dinp as it was.
  const int IC = 40;
  auto dinp = random_of<F>(size_t(M) * IC);
  Dev<F> d_dinp(dinp), d_dout(1), d_inp(size_t(M) * IC), d_w(1);
  Dev<float> d_dw(1);
  gpu::matmul_backward<F>(d_dinp, d_dw, nullptr, d_dout, d_inp, d_w, M, IC, 0);
  EXPECT_CLOSE(d_dinp.fetch(), dinp, 0.0, "matmul_backward OC=0 dinp");
}

TYPED_TEST(CudaOp, Matmul) {
  using F = TypeParam;
  const int N = 37, IC = 67;
  for (int OC : {45, 48}) {  // 48: the bias's 16-byte path; 45: the scalar one
    const std::string shape = " OC=" + std::to_string(OC);
    auto inp = random_of<F>(size_t(N) * IC), w = random_of<F>(size_t(OC) * IC);
    auto bias = random_of<F>(OC);
    Dev<F> d_inp(inp), d_w(w), d_bias(bias);
    for (bool with_bias : {true, false}) {
      Dev<F> d_out(size_t(N) * OC);
      std::vector<double> out(size_t(N) * OC);
      gpu::matmul_forward<F>(d_out, d_inp, d_w, with_bias ? d_bias.get() : nullptr, N, IC, OC);
      cpu::matmul_forward<double>(out.data(), inp.data(), w.data(),
                                  with_bias ? bias.data() : nullptr, N, IC, OC);
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(),
                   "matmul_forward bias=" + std::to_string(with_bias) + shape);
    }
    {
      auto out = random_of<F>(size_t(N) * OC);
      Dev<F> d_out(out);
      gpu::bias_add<F>(d_out, d_bias, N, OC);
      cpu::bias_add<double>(out.data(), bias.data(), N, OC);
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "bias_add" + shape);
    }
    for (bool all : {true, false}) {
      auto dout = random_of<F>(size_t(N) * OC);
      auto dinp = random_of<F>(size_t(N) * IC);
      auto dw = random_of<float>(size_t(OC) * IC), db = random_of<float>(OC);
      Dev<F> d_dout(dout), d_dinp(dinp);
      Dev<float> d_dw(dw), d_db(db);
      gpu::matmul_backward<F>(all ? d_dinp.get() : nullptr, d_dw, all ? d_db.get() : nullptr,
                              d_dout, d_inp, d_w, N, IC, OC);
      cpu::matmul_backward<double>(all ? dinp.data() : nullptr, dw.data(),
                                   all ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                                   N, IC, OC);
      const std::string what = " (dinp, dbias " + std::string(all ? "given" : "nullptr") + ")";
      EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "matmul_backward dinp" + what + shape);
      EXPECT_CLOSE(d_dw.fetch(), dw, tolerance<F>(), "matmul_backward dweight" + what + shape);
      EXPECT_CLOSE(d_db.fetch(), db, tolerance<F>(), "matmul_backward dbias" + what + shape);
    }
  }
}

TYPED_TEST(CudaOp, Encoder) {
  using F = TypeParam;
  const int B = 3, T = 13, V = 50, v0 = 10, vcount = 25;  // this rank holds rows [10, 35)
  for (int C : {40, 37}) {
    const std::string shape = " C=" + std::to_string(C);
    std::vector<int32_t> tokens(size_t(B) * T);
    std::uniform_int_distribution<int> tok(0, V - 1);
    for (int32_t& t : tokens) t = tok(rng());
    tokens[0] = tokens[5] = tokens[17] = v0 + 3;  // repeats: the backward must add them all
    DevInts d_tokens(tokens);
    auto wte = random_of<F>(size_t(vcount) * C), wpe = random_of<F>(size_t(T + 2) * C);
    Dev<F> d_wte(wte), d_wpe(wpe);
    // data.document_mask's positions in the documents: rows of wpe repeat (0 most of all).
    std::vector<int32_t> pos(size_t(B) * T);
    for (size_t i = 0; i < pos.size(); i++) pos[i] = int32_t(i % 5 == 0 ? 0 : i % 7);
    DevInts d_pos(pos);
    for (int mode : {0, 1, 2}) {  // wpe by sequence position, none, wpe by document position
      const bool with_wpe = mode != 1;
      const int32_t* dev_pos = mode == 2 ? static_cast<const int32_t*>(d_pos) : nullptr;
      const int32_t* host_pos = mode == 2 ? pos.data() : nullptr;
      const std::string what = " mode=" + std::to_string(mode) + shape;
      Dev<F> d_out(size_t(B) * T * C);
      std::vector<double> out(size_t(B) * T * C);
      gpu::encoder_forward<F>(d_out, d_tokens, d_wte, with_wpe ? d_wpe.get() : nullptr, B, T, C,
                              v0, vcount, dev_pos);
      cpu::encoder_forward<double>(out.data(), tokens.data(), wte.data(),
                                   with_wpe ? wpe.data() : nullptr, B, T, C, v0, vcount, host_pos);
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "encoder_forward" + what);

      auto dout = random_of<F>(size_t(B) * T * C);
      auto dwte = random_of<float>(size_t(vcount) * C), dwpe = random_of<float>(size_t(T + 2) * C);
      Dev<F> d_dout(dout);
      Dev<float> d_dwte(dwte), d_dwpe(dwpe);
      gpu::encoder_backward<F>(d_dwte, with_wpe ? d_dwpe.get() : nullptr, d_dout, d_tokens, B, T,
                               C, v0, vcount, dev_pos);
      cpu::encoder_backward<double>(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                                    tokens.data(), B, T, C, v0, vcount, host_pos);
      EXPECT_CLOSE(d_dwte.fetch(), dwte, tolerance<F>(), "encoder_backward dwte" + what);
      EXPECT_CLOSE(d_dwpe.fetch(), dwpe, tolerance<F>(), "encoder_backward dwpe" + what);
    }
  }
}

TYPED_TEST(CudaOp, LayerNorm) {
  using F = TypeParam;
  const int N = 37;
  for (int C : {64, 67}) {
    const std::string shape = " C=" + std::to_string(C);
    auto inp = random_of<F>(size_t(N) * C, -0.5, 1.5);  // a mean away from 0
    auto w = random_of<F>(C, 0.5, 1.5), b = random_of<F>(C);
    Dev<F> d_inp(inp), d_w(w), d_b(b), d_out(size_t(N) * C);
    Dev<float> d_mean(N), d_rstd(N);
    std::vector<double> out(size_t(N) * C), mean(N), rstd(N);
    gpu::layernorm_forward<F>(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    cpu::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                   b.data(), N, C);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "layernorm_forward out" + shape);
    EXPECT_CLOSE(d_mean.fetch(), mean, tolerance<F>(), "layernorm_forward mean" + shape);
    EXPECT_CLOSE(d_rstd.fetch(), rstd, tolerance<F>(), "layernorm_forward rstd" + shape);

    // The backward reads the statistics as fp32 on both sides.
    mean = rounded<float>(mean);
    rstd = rounded<float>(rstd);
    d_mean.put(mean);
    d_rstd.put(rstd);
    auto dout = random_of<F>(size_t(N) * C), dinp = random_of<F>(size_t(N) * C);
    auto dw = random_of<float>(C), db = random_of<float>(C);
    Dev<F> d_dout(dout), d_dinp(dinp);
    Dev<float> d_dw(dw), d_db(db);
    gpu::layernorm_backward<F>(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    cpu::layernorm_backward<double>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                    w.data(), mean.data(), rstd.data(), N, C);
    EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "layernorm_backward dinp" + shape);
    EXPECT_CLOSE(d_dw.fetch(), dw, tolerance<F>(), "layernorm_backward dweight" + shape);
    EXPECT_CLOSE(d_db.fetch(), db, tolerance<F>(), "layernorm_backward dbias" + shape);
  }
}

// C = 64: the 16-byte paths; 67 and an unaligned offset: the scalar ones. The weight gradient's
// column sums (two passes) cover rows past one chunk with N = 300.
TYPED_TEST(CudaOp, RmsNorm) {
  using F = TypeParam;
  const double eps = 1e-5;
  struct Case {
    int N, C;
    size_t offset;
  };
  for (Case k : {Case{37, 64, 0}, Case{37, 67, 0}, Case{37, 64, 1}, Case{300, 96, 0}}) {
    const int N = k.N, C = k.C;
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                              " offset=" + std::to_string(k.offset);
    auto inp = random_of<F>(size_t(N) * C, -1.0, 2.0);
    auto w = random_of<F>(C, 0.5, 1.5);
    Dev<F> d_inp(inp, k.offset), d_w(w, k.offset), d_out(size_t(N) * C, k.offset);
    Dev<float> d_rstd(N);
    std::vector<double> out(size_t(N) * C), rstd(N);
    gpu::rmsnorm_forward<F>(d_out, d_rstd, d_inp, d_w, N, C, eps);
    cpu::rmsnorm_forward<double>(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "rmsnorm_forward out" + shape);
    EXPECT_CLOSE(d_rstd.fetch(), rstd, tolerance<F>(), "rmsnorm_forward rstd" + shape);

    // The backward reads rstd as fp32 on both sides.
    rstd = rounded<float>(rstd);
    d_rstd.put(rstd);
    auto dout = random_of<F>(size_t(N) * C), dinp = random_of<F>(size_t(N) * C);
    auto dw = random_of<float>(C);
    Dev<F> d_dout(dout, k.offset), d_dinp(dinp, k.offset);
    Dev<float> d_dw(dw);
    gpu::rmsnorm_backward<F>(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    cpu::rmsnorm_backward<double>(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                                  rstd.data(), N, C);
    EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "rmsnorm_backward dinp" + shape);
    EXPECT_CLOSE(d_dw.fetch(), dw, tolerance<F>(), "rmsnorm_backward dweight" + shape);
  }
}

// model.qk_norm's per-head norm of the q and k heads of qkv in place, forward and backward,
// against the CPU op in double: every element of qkv (the v heads untouched), the raw copy, each
// head's rstd, the weight's gradient (column sums past one chunk with N = 300); head sizes a
// multiple of the warp and not (40: idle lanes), one key/value head.
TYPED_TEST(CudaOp, QkNorm) {
  using F = TypeParam;
  const double eps = 1e-6;
  struct Shape {
    int N, NH, NKV, hs;
  };
  for (Shape s : {Shape{37, 4, 2, 64}, Shape{300, 3, 1, 40}, Shape{5, 2, 2, 128}}) {
    const std::string shape = " N=" + std::to_string(s.N) + " NH=" + std::to_string(s.NH) +
                              " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs);
    const size_t n = size_t(s.N) * (s.NH + 2 * s.NKV) * s.hs;
    const size_t heads = size_t(s.N) * (s.NH + s.NKV);
    auto x = random_of<F>(n, -1.0, 2.0), w = random_of<F>(2 * size_t(s.hs), 0.5, 1.5);
    Dev<F> d_x(x), d_w(w), d_raw(heads * s.hs);
    Dev<float> d_rstd(heads);
    std::vector<double> raw(heads * s.hs), rstd(heads);
    gpu::qk_norm_forward<F>(d_x, d_raw, d_rstd, d_w, s.N, s.NH, s.NKV, s.hs, eps);
    cpu::qk_norm_forward<double>(x.data(), raw.data(), rstd.data(), w.data(), s.N, s.NH, s.NKV,
                                 s.hs, eps);
    EXPECT_CLOSE(d_x.fetch(), x, tolerance<F>(), "qk_norm_forward out" + shape);
    EXPECT_CLOSE(d_raw.fetch(), raw, 0.0, "qk_norm_forward raw" + shape);
    EXPECT_CLOSE(d_rstd.fetch(), rstd, tolerance<F>(), "qk_norm_forward rstd" + shape);

    // The backward reads rstd as fp32 on both sides, and the forward's raw heads.
    rstd = rounded<float>(rstd);
    d_rstd.put(rstd);
    auto dx = random_of<F>(n), dw = random_of<float>(2 * size_t(s.hs));
    Dev<F> d_dx(dx);
    Dev<float> d_dw(dw);
    gpu::qk_norm_backward<F>(d_dx, d_dw, d_raw, d_w, d_rstd, s.N, s.NH, s.NKV, s.hs);
    cpu::qk_norm_backward<double>(dx.data(), dw.data(), raw.data(), w.data(), rstd.data(), s.N,
                                  s.NH, s.NKV, s.hs);
    EXPECT_CLOSE(d_dx.fetch(), dx, tolerance<F>(), "qk_norm_backward dqkv" + shape);
    EXPECT_CLOSE(d_dw.fetch(), dw, tolerance<F>(), "qk_norm_backward dweight" + shape);
  }
}

// Rotary embeddings in place, forward and backward, on the grouped-query qkv layout: every
// element compared (the v heads must come back untouched), odd T and head counts.
TYPED_TEST(CudaOp, Rope) {
  using F = TypeParam;
  struct Shape {
    int B, T, NH, NKV, hs;
  };
  for (Shape s : {Shape{2, 13, 4, 2, 64}, Shape{1, 37, 3, 1, 10}, Shape{2, 7, 2, 2, 128}}) {
    const std::string shape = " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                              " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                              " hs=" + std::to_string(s.hs);
    std::vector<float> table(size_t(s.T) * s.hs);
    cpu::rope_table(table.data(), s.T, s.hs, 10000.0);
    Dev<float> d_cs(std::vector<double>(table.begin(), table.end()));
    const size_t n = size_t(s.B) * s.T * (s.NH + 2 * s.NKV) * s.hs;
    for (bool forward : {true, false}) {
      auto x = random_of<F>(n, -2.0, 2.0);
      Dev<F> d_x(x);
      if (forward) {
        gpu::rope_forward<F>(d_x, d_cs, s.B, s.T, s.NH, s.NKV, s.hs);
        cpu::rope_forward<double>(x.data(), table.data(), s.B, s.T, s.NH, s.NKV, s.hs);
      } else {
        gpu::rope_backward<F>(d_x, d_cs, s.B, s.T, s.NH, s.NKV, s.hs);
        cpu::rope_backward<double>(x.data(), table.data(), s.B, s.T, s.NH, s.NKV, s.hs);
      }
      EXPECT_CLOSE(d_x.fetch(), x, tolerance<F>(),
                   std::string(forward ? "rope_forward" : "rope_backward") + shape);
    }
  }
}

struct AttentionShape {
  int B, T, NH, NKV, hs;
  std::string name() const {
    return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
           " NKV=" + std::to_string(NKV) + " hs=" + std::to_string(hs);
  }
};

// data.document_mask's document starts (B,T) of documents 1 to 40 tokens long, drawn from a fixed
// seed: rows whose document starts past a key tile see nothing of it, and some documents start
// inside a query tile.
std::vector<int32_t> document_starts(const AttentionShape& s) {
  std::vector<int32_t> start(size_t(s.B) * s.T);
  uint64_t x = 88172645463325252ull;
  auto next_len = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return 1 + int(x % 40);
  };
  for (int b = 0; b < s.B; b++)
    for (int t = 0, at = 0, next = next_len(); t < s.T; t++) {
      if (t == next) at = t, next = t + next_len();
      start[size_t(b) * s.T + size_t(t)] = at;
    }
  return start;
}

// Multi-head (NKV = NH, GPT-2's) and grouped-query shapes: two query heads per kv head (the
// batches over kv heads), four or more (the kv head broadcast over its group), one kv head for all;
// each without and with a document mask.
TYPED_TEST(CudaOp, Attention) {
  using F = TypeParam;
  // T = 32: the softmax's 16-byte path; 37 and 33: the scalar one.
  for (AttentionShape s : {AttentionShape{2, 37, 3, 3, 16}, AttentionShape{1, 33, 2, 2, 18},
                           AttentionShape{2, 32, 4, 4, 16}, AttentionShape{2, 37, 4, 2, 64},
                           AttentionShape{1, 33, 8, 2, 64}, AttentionShape{1, 35, 4, 1, 128},
                           AttentionShape{2, 70, 4, 2, 16}})
    for (bool docs : {false, true}) {  // without and with a document mask
    const std::string shape = s.name() + (docs ? " documents" : "");
    const size_t n_qkv = size_t(s.B) * s.T * (s.NH + 2 * s.NKV) * s.hs;
    const size_t n_out = size_t(s.B) * s.T * s.NH * s.hs;
    const size_t n_att = size_t(s.B) * s.NH * s.T * s.T;
    const std::vector<int32_t> start = document_starts(s);
    const DevInts d_start(start);
    const int32_t* dev_start = docs ? static_cast<const int32_t*>(d_start) : nullptr;
    auto qkv = random_of<F>(n_qkv, -2.0, 2.0);
    Dev<F> d_qkv(qkv), d_out(n_out), d_att(n_att);
    std::vector<double> out(n_out), att(n_att);
    gpu::attention_forward<F>(d_out, d_att, d_qkv, s.B, s.T, s.NH, s.NKV, s.hs, dev_start);
    cpu::attention_forward<double>(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.NKV,
                                   s.hs, docs ? start.data() : nullptr);
    EXPECT_CLOSE(d_att.fetch(), att, tolerance<F>(), "attention_forward att" + shape);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "attention_forward out" + shape);

    // The backward reads the forward's att; both sides get the reference's, rounded to F.
    att = rounded<F>(att);
    d_att.put(att);
    auto dout = random_of<F>(n_out), dqkv = random_of<F>(n_qkv);
    Dev<F> d_dout(dout), d_dqkv(dqkv), d_datt(n_att);
    std::vector<double> datt(n_att);
    gpu::attention_backward<F>(d_dqkv, d_datt, d_dout, d_qkv, d_att, s.B, s.T, s.NH, s.NKV,
                               s.hs);
    cpu::attention_backward<double>(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                                    s.B, s.T, s.NH, s.NKV, s.hs);
    EXPECT_CLOSE(d_dqkv.fetch(), dqkv, tolerance<F>(), "attention_backward dqkv" + shape);
  }
}

// The fused (flash-style) kernels against the CPU's fused attention in double: odd T, T not a
// multiple of a key tile (32) or a query tile (8 or 16 rows), head sizes 12 (a 32-wide tile), 64
// and 128, heads whose columns start off a 16-byte boundary; multi-head, and grouped-query with
// 2 and 4 query heads per kv head (dK and dV summed over them); each without and with a document
// mask (whole key tiles hidden from some rows).
TYPED_TEST(CudaOp, AttentionFused) {
  using F = TypeParam;
  for (AttentionShape s : {AttentionShape{2, 37, 3, 3, 12}, AttentionShape{1, 70, 2, 2, 64},
                           AttentionShape{1, 45, 1, 1, 128}, AttentionShape{2, 33, 2, 2, 128},
                           AttentionShape{1, 1, 1, 1, 64}, AttentionShape{2, 37, 4, 2, 64},
                           AttentionShape{1, 35, 4, 1, 128}, AttentionShape{2, 100, 2, 1, 32}})
    for (bool docs : {false, true}) {  // without and with a document mask
    const std::string shape = s.name() + (docs ? " documents" : "");
    const size_t n_qkv = size_t(s.B) * s.T * (s.NH + 2 * s.NKV) * s.hs;
    const size_t n_out = size_t(s.B) * s.T * s.NH * s.hs;
    const size_t n_lse = size_t(s.B) * s.NH * s.T;
    const std::vector<int32_t> start = document_starts(s);
    const DevInts d_start(start);
    const int32_t* dev_start = docs ? static_cast<const int32_t*>(d_start) : nullptr;
    const int32_t* host_start = docs ? start.data() : nullptr;
    auto qkv = random_of<F>(n_qkv, -2.0, 2.0);
    Dev<F> d_qkv(qkv), d_out(n_out);
    Dev<float> d_lse(n_lse);
    std::vector<double> out(n_out), lse(n_lse);
    gpu::attention_fused_forward<F>(d_out, d_lse, d_qkv, s.B, s.T, s.NH, s.NKV, s.hs, dev_start);
    cpu::attention_fused_forward<double>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV,
                                         s.hs, host_start);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "attention_fused_forward out" + shape);
    // The log-sum-exps within 1e-5 of max(1, their largest): a single key (T = 1) makes one a
    // plain dot product of 64 terms of up to 4, which can cancel to 0.01, and fp32's 1e-7 of the
    // terms is then 1e-5 of the result: an absolute floor, as the loss they feed sees them.
    double lse_top = 0;
    for (double x : lse) lse_top = std::max(lse_top, std::fabs(x));
    EXPECT_CLOSE(d_lse.fetch(), lse, lse_top > 0 ? 1e-5 * std::max(1.0, lse_top) / lse_top : 1e-5,
                 "attention_fused_forward lse" + shape);

    // The backward reads the forward's out and lse; both sides get the reference's, rounded.
    out = rounded<F>(out);
    lse = rounded<float>(lse);
    d_out.put(out);
    d_lse.put(lse);
    auto dout = random_of<F>(n_out), dqkv = random_of<F>(n_qkv);
    Dev<F> d_dout(dout), d_dqkv(dqkv);
    gpu::attention_fused_backward<F>(d_dqkv, d_dout, d_qkv, d_out, d_lse, s.B, s.T, s.NH, s.NKV,
                                     s.hs, dev_start);
    cpu::attention_fused_backward<double>(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          lse.data(), s.B, s.T, s.NH, s.NKV, s.hs, host_start);
    EXPECT_CLOSE(d_dqkv.fetch(), dqkv, tolerance<F>(), "attention_fused_backward dqkv" + shape);
  }
}

TYPED_TEST(CudaOp, Elementwise) {
  using F = TypeParam;
  const size_t n = 1003;  // not a multiple of a pack or a block
  for (size_t offset : {size_t(0), size_t(1)}) {  // 1: unaligned, the scalar paths
    const std::string what = offset ? " (unaligned)" : " (aligned)";
    auto x = random_of<F>(n, -4.0, 4.0), y = random_of<F>(n);
    Dev<F> d_x(x, offset), d_y(y, offset);
    {
      Dev<F> d_out(n, offset);
      std::vector<double> out(n);
      gpu::gelu_forward<F>(d_out, d_x, n);
      cpu::gelu_forward<double>(out.data(), x.data(), n);
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "gelu_forward" + what);
      EXPECT_WITHIN_ULP(F, d_out.fetch(), out, nullptr, "gelu_forward" + what);
    }
    {
      auto dinp = random_of<F>(n);
      std::vector<double> terms(n, 0.0);  // |dinp| + |gelu'(x) dout|
      cpu::gelu_backward<double>(terms.data(), x.data(), y.data(), n);
      for (size_t i = 0; i < n; i++) terms[i] = std::fabs(terms[i]) + std::fabs(dinp[i]);
      Dev<F> d_dinp(dinp, offset);
      gpu::gelu_backward<F>(d_dinp, d_x, d_y, n);
      cpu::gelu_backward<double>(dinp.data(), x.data(), y.data(), n);
      EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "gelu_backward" + what);
      EXPECT_WITHIN_ULP(F, d_dinp.fetch(), dinp, &terms, "gelu_backward" + what);
    }
    {
      Dev<F> d_out(n, offset);
      std::vector<double> out(n);
      gpu::residual_forward<F>(d_out, d_x, d_y, n);
      cpu::residual_forward<double>(out.data(), x.data(), y.data(), n);
      std::vector<double> terms(n);
      for (size_t i = 0; i < n; i++) terms[i] = std::fabs(x[i]) + std::fabs(y[i]);
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "residual_forward" + what);
      EXPECT_WITHIN_ULP(F, d_out.fetch(), out, &terms, "residual_forward" + what);
    }
    {
      auto dst = random_of<F>(n);
      std::vector<double> terms(n);
      for (size_t i = 0; i < n; i++) terms[i] = std::fabs(dst[i]) + std::fabs(y[i]);
      Dev<F> d_dst(dst, offset);
      gpu::add_inplace<F>(d_dst, d_y, n);
      cpu::add_inplace<double>(dst.data(), y.data(), n);
      EXPECT_CLOSE(d_dst.fetch(), dst, tolerance<F>(), "add_inplace" + what);
      EXPECT_WITHIN_ULP(F, d_dst.fetch(), dst, &terms, "add_inplace" + what);
    }
  }
}

// H = 64: the 16-byte paths; H = 67 and an unaligned offset: the scalar ones.
TYPED_TEST(CudaOp, Swiglu) {
  using F = TypeParam;
  const int N = 37;
  for (auto [H, offset] :
       {std::pair{64, size_t(0)}, std::pair{67, size_t(0)}, std::pair{64, size_t(1)}}) {
    const std::string what = " H=" + std::to_string(H) + " offset=" + std::to_string(offset);
    auto inp = random_of<F>(size_t(N) * 2 * H, -6.0, 6.0);
    Dev<F> d_inp(inp, offset), d_out(size_t(N) * H, offset);
    std::vector<double> out(size_t(N) * H);
    gpu::swiglu_forward<F>(d_out, d_inp, N, H);
    cpu::swiglu_forward<double>(out.data(), inp.data(), N, H);
    EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "swiglu_forward" + what);

    auto dout = random_of<F>(size_t(N) * H), dinp = random_of<F>(size_t(N) * 2 * H);
    Dev<F> d_dout(dout, offset), d_dinp(dinp, offset);
    gpu::swiglu_backward<F>(d_dinp, d_inp, d_dout, N, H);
    cpu::swiglu_backward<double>(dinp.data(), inp.data(), dout.data(), N, H);
    EXPECT_CLOSE(d_dinp.fetch(), dinp, tolerance<F>(), "swiglu_backward" + what);
  }
}

// fp32 += bf16: the mixed-precision gradient sum. Exact up to the fp32 rounding of each add.
TEST(CudaOpMixed, AddInplaceFp32FromBf16) {
  const size_t n = 1003;
  for (size_t offset : {size_t(0), size_t(1)}) {
    auto dst = random_of<float>(n), src = random_of<bf16>(n);
    Dev<float> d_dst(dst, offset);
    Dev<bf16> d_src(src, offset);
    gpu::add_inplace(d_dst.get(), d_src.get(), n);
    cpu::add_inplace<double>(dst.data(), src.data(), n);
    EXPECT_CLOSE(d_dst.fetch(), dst, 1e-6, "add_inplace fp32 += bf16 offset " +
                                               std::to_string(offset));
  }
}

TYPED_TEST(CudaOp, CrossEntropy) {
  using F = TypeParam;
  const int N = 37;
  // (Vl, valid): the last columns are vocabulary padding; Vl = 64 takes the 16-byte row paths.
  for (auto [Vl, valid] : {std::pair{70, 63}, std::pair{64, 57}})
  for (int v0 : {0, 40}) {  // 40: a second tensor-parallel rank's slice; some targets elsewhere
    const std::string what = " v0=" + std::to_string(v0) + " Vl=" + std::to_string(Vl);
    std::vector<int32_t> targets(N);
    std::uniform_int_distribution<int> tgt(0, 109);
    for (int32_t& t : targets) t = tgt(rng());
    targets[0] = v0;  // at least one target in this slice
    DevInts d_targets(targets);
    auto logits = random_of<F>(size_t(N) * Vl, -3.0, 3.0);
    Dev<F> d_logits(logits);
    Dev<float> d_max(N);
    std::vector<double> mx(N);
    gpu::crossentropy_row_max<F>(d_max, d_logits, N, Vl, valid);
    cpu::crossentropy_row_max<double>(mx.data(), logits.data(), N, Vl, valid);
    EXPECT_CLOSE(d_max.fetch(), mx, tolerance<F>(), "crossentropy_row_max" + what);

    // probs alias logits (in place), as the trainer calls it.
    Dev<double> d_sums(size_t(2) * N);
    std::vector<double> sums(size_t(2) * N), probs = logits;
    gpu::crossentropy_exp_sums<F>(d_sums, d_logits, d_logits, d_max, d_targets, N, Vl, valid, v0);
    cpu::crossentropy_exp_sums<double>(sums.data(), probs.data(), probs.data(),
                                       rounded<float>(mx).data(), targets.data(), N, Vl, valid,
                                       v0);
    EXPECT_CLOSE(d_sums.fetch(), sums, tolerance<F>(), "crossentropy_exp_sums sums" + what);
    EXPECT_CLOSE(d_logits.fetch(), probs, tolerance<F>(), "crossentropy_exp_sums probs" + what);

    probs = rounded<F>(probs);
    d_logits.put(probs);
    d_sums.put(sums);
    Dev<float> d_losses(N);
    std::vector<double> losses(N);
    gpu::crossentropy_finish<F>(d_losses, d_logits, d_sums, N, Vl, valid);
    cpu::crossentropy_finish<double>(losses.data(), probs.data(), sums.data(), N, Vl, valid);
    EXPECT_CLOSE(d_losses.fetch(), losses, tolerance<F>(), "crossentropy_finish losses" + what);
    EXPECT_CLOSE(d_logits.fetch(), probs, tolerance<F>(), "crossentropy_finish probs" + what);

    probs = rounded<F>(probs);
    d_logits.put(probs);
    const double dloss = 1.0 / N;
    gpu::crossentropy_backward<F>(d_logits, d_logits, d_targets, float(dloss), N, Vl, valid, v0);
    cpu::crossentropy_backward<double>(probs.data(), probs.data(), targets.data(), dloss, N, Vl,
                                       valid, v0);
    EXPECT_CLOSE(d_logits.fetch(), probs, tolerance<F>(), "crossentropy_backward" + what);
  }
}

// A vocabulary that is a multiple of the pack takes the 16-byte path of the backward.
TYPED_TEST(CudaOp, CrossEntropyBackwardPacked) {
  using F = TypeParam;
  const int N = 5, Vl = 64, valid = 57, v0 = 0;
  std::vector<int32_t> targets = {0, 56, 57, 3, 63};  // 57 and 63 fall in the padding
  DevInts d_targets(targets);
  auto probs = random_of<F>(size_t(N) * Vl, 0.0, 1.0);
  Dev<F> d_probs(probs), d_dlogits(probs.size());
  std::vector<double> dlogits(probs.size());
  gpu::crossentropy_backward<F>(d_dlogits, d_probs, d_targets, 0.25f, N, Vl, valid, v0);
  cpu::crossentropy_backward<double>(dlogits.data(), probs.data(), targets.data(), 0.25, N, Vl,
                                     valid, v0);
  EXPECT_CLOSE(d_dlogits.fetch(), dlogits, tolerance<F>(), "crossentropy_backward packed");
}

// AdamW against the CPU's fp32 update (the master weights are fp32 in both precisions), with
// and without the bf16 copy, decay on and off.
TEST(CudaOptim, AdamW) {
  const size_t n = 1003;
  const AdamWHyper hyper{0.9, 0.95, 1e-8, 0.1};
  for (size_t offset : {size_t(0), size_t(1)}) {
    for (bool decay : {true, false}) {
      auto p = random_of<float>(n), g = random_of<float>(n), m = random_of<float>(n, -0.1, 0.1);
      auto v = random_of<float>(n, 0.0, 0.01);
      Dev<float> d_p(p, offset), d_g(g, offset), d_m(m, offset), d_v(v, offset);
      Dev<bf16> d_copy(n, offset);
      gpu::adamw_update(d_p.get(), d_copy.get(), d_g.get(), d_m.get(), d_v.get(), n, decay, hyper,
                        3e-3, 7);
      std::vector<float> pf(p.begin(), p.end()), gf(g.begin(), g.end()), mf(m.begin(), m.end()),
          vf(v.begin(), v.end());
      cpu::adamw_update(pf.data(), nullptr, gf.data(), mf.data(), vf.data(), n, decay, hyper, 3e-3,
                        7);
      const std::string what =
          " decay=" + std::to_string(decay) + " offset=" + std::to_string(offset);
      const std::vector<double> want_p(pf.begin(), pf.end());
      EXPECT_CLOSE(d_p.fetch(), want_p, 1e-5, "adamw params" + what);
      EXPECT_CLOSE(d_m.fetch(), std::vector<double>(mf.begin(), mf.end()), 1e-5, "adamw m" + what);
      EXPECT_CLOSE(d_v.fetch(), std::vector<double>(vf.begin(), vf.end()), 1e-5, "adamw v" + what);
      EXPECT_CLOSE(d_copy.fetch(), rounded<bf16>(want_p), 2e-2, "adamw bf16 copy" + what);
    }
  }
}

TEST(CudaOptim, SumOfSquaresAndScale) {
  for (size_t n : {size_t(1), size_t(1003), (size_t(1) << 20) + 7}) {
    auto x = random_of<float>(n);
    Dev<float> d_x(x);
    const std::vector<float> xf(x.begin(), x.end());
    double want = 0.5;  // both add into what the accumulator held
    cpu::sum_of_squares(&want, xf.data(), n);
    Dev<double> acc(std::vector<double>{0.5});
    gpu::sum_of_squares(acc.get(), d_x.get(), n);
    const double got = acc.fetch()[0];
    EXPECT_NEAR(got, want, 1e-12 * want) << "sum_of_squares n=" << n;
    acc.put({0.5});
    gpu::sum_of_squares(acc.get(), d_x.get(), n);
    EXPECT_EQ(got, acc.fetch()[0]) << "sum_of_squares is not deterministic";
    gpu::scale(d_x, n, 0.5f);
    for (double& e : x) e *= 0.5;
    EXPECT_CLOSE(d_x.fetch(), x, 0.0, "scale n=" + std::to_string(n));
  }
}

}  // namespace
}  // namespace tessera::gpu_test
