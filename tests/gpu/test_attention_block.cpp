// Context parallelism's CUDA ops (backend/cuda/attention_block.cu, residual.cu's column copies)
// against their CPU twins in double on the values the device holds, as test_ops.cpp does the
// others: max |gpu - cpu| / max |cpu| <= 1e-5 in fp32 and 2e-2 in bf16.
//
// A block as the ring gives it: the query chunk is the second half of a rank's Tl = 2 rows
// positions in qkv's rows (so every stride differs from the chunk's own size and the lse rows are
// Tl long), the keys and values packed blocks of [k heads | v heads]. Two blocks merge into the
// same out and lse, an off-diagonal one (every key visible) and then a diagonal one (causal), and
// their backward accumulates into random dq, dK/dV. Chunks of 70 rows span two key tiles of 32
// and a partial one (and query tiles of 8 and 16 rows with a partial last); 37 rows with head
// size 12 take the 32-wide tile's masked dimensions; grouped-query heads sum dK/dV over their
// query heads. Chunks of 33 and 65 rows end with a query tile whose last row is the first key of a
// key tile (32, 64): a causal skip of key tiles off by one key drops that key there, as a 1-row
// chunk's does at key 0. Each shape also runs under a document mask (AttentionBlock::q_start).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend/cpu/ops.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

namespace cpu = tessera::cpu;
namespace gpu = tessera::cuda;

template <typename F>
class CudaBlock : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CudaBlock, Types, TypeNames);

struct BlockShape {
  int B, rows, NH, NKV, hs;
  std::string name() const {
    return " B=" + std::to_string(B) + " rows=" + std::to_string(rows) + " NH=" +
           std::to_string(NH) + " NKV=" + std::to_string(NKV) + " hs=" + std::to_string(hs);
  }
};

// compare()'s tolerance as an absolute floor of 1e-5 x max(1, the largest |x|) (log-sum-exps:
// test_ops.cpp's AttentionFused says why).
double floored(const std::vector<double>& want) {
  double top = 0;
  for (double x : want) top = std::max(top, std::fabs(x));
  return top > 0 ? 1e-5 * std::max(1.0, top) / top : 1e-5;
}

TYPED_TEST(CudaBlock, ForwardAndBackward) {
  using F = TypeParam;
  for (BlockShape s : {BlockShape{2, 70, 4, 2, 64}, BlockShape{2, 37, 3, 3, 12},
                       BlockShape{1, 45, 2, 1, 128}, BlockShape{1, 1, 2, 2, 32},
                       BlockShape{1, 33, 2, 1, 64}, BlockShape{2, 65, 2, 2, 32}})
    for (bool docs : {false, true}) {  // without and with a document mask
    const std::string shape = s.name() + (docs ? " documents" : "");
    const int Tl = 2 * s.rows, C3 = (s.NH + 2 * s.NKV) * s.hs, Cq = s.NH * s.hs;
    const int W = 2 * s.NKV * s.hs;
    const size_t n_qkv = size_t(s.B) * Tl * C3, n_out = size_t(s.B) * Tl * Cq;
    const size_t n_kv = size_t(s.B) * Tl * W, n_lse = size_t(s.B) * s.NH * Tl;
    // The chunk's first row in each buffer (its second half) and the block's strides.
    const size_t q0 = size_t(s.rows) * C3, o0 = size_t(s.rows) * Cq, l0 = size_t(s.rows);
    const size_t k0 = size_t(s.rows) * W;
    AttentionBlock blk{s.B, s.rows, s.NH, s.NKV, s.hs, C3, Cq, W, Tl,
                       size_t(Tl) * C3, size_t(Tl) * Cq, size_t(Tl) * W, false};
    // Under a document mask the off-diagonal keys sit at positions 0 .. rows - 1 and the query
    // chunk (the diagonal block's keys) at rows .. 2 rows - 1; documents of 1 to 24 tokens over
    // them, so many query rows see none of the off-diagonal block and some see part of it.
    std::vector<int32_t> start(size_t(s.B) * Tl);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    auto next_len = [&] {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      return 1 + int(x % 24);
    };
    for (int b = 0; b < s.B; b++)
      for (int t = 0, at = 0, next = next_len(); t < Tl; t++) {
        if (t == next) at = t, next = t + next_len();
        start[size_t(b) * Tl + size_t(t)] = at;
      }
    const DevInts d_start(start);
    // The block as each side reads it: the query rows' starts in its own memory.
    auto on = [&](bool gpu_side) {
      AttentionBlock b = blk;
      if (docs) {
        b.q_start = (gpu_side ? static_cast<const int32_t*>(d_start) : start.data()) + s.rows;
        b.bstart = size_t(Tl);
        b.k_pos = blk.diagonal ? s.rows : 0;
      }
      return b;
    };

    auto qkv = random_of<F>(n_qkv, -2.0, 2.0);
    auto kv_off = random_of<F>(n_kv, -2.0, 2.0), kv_diag = random_of<F>(n_kv, -2.0, 2.0);
    // The chunk's rows start at 0 and -inf (the forward's start); the others hold values the
    // ops must leave alone.
    std::vector<double> out(n_out, 0.0), lse(n_lse, 0.25);
    for (int bh = 0; bh < s.B * s.NH; bh++)
      for (int i = s.rows; i < Tl; i++) lse[size_t(bh) * Tl + i] = -INFINITY;
    Dev<F> d_qkv(qkv), d_kv_off(kv_off), d_kv_diag(kv_diag), d_out(out);
    Dev<float> d_lse(lse);
    for (int diagonal = 0; diagonal < 2; diagonal++) {
      blk.diagonal = diagonal == 1;
      const std::vector<double>& kv = diagonal ? kv_diag : kv_off;
      gpu::attention_block_forward<F>(d_out + o0, d_lse + l0, d_qkv + q0,
                                      (diagonal ? d_kv_diag : d_kv_off) + k0, on(true));
      cpu::attention_block_forward<double>(out.data() + o0, lse.data() + l0, qkv.data() + q0,
                                           kv.data() + k0, on(false));
      const std::string what = (diagonal ? " after the diagonal block" : " off-diagonal") + shape;
      EXPECT_CLOSE(d_out.fetch(), out, tolerance<F>(), "attention_block_forward out" + what);
      // Rows a document mask hid from every key so far keep their -inf: the same rows on both
      // sides, then the rest compared.
      std::vector<double> got_lse = d_lse.fetch(), want_lse = lse;
      size_t differ = 0;
      for (size_t i = 0; i < got_lse.size(); i++) {
        differ += (got_lse[i] == -INFINITY) != (want_lse[i] == -INFINITY);
        if (want_lse[i] == -INFINITY) got_lse[i] = want_lse[i] = 0.0;
      }
      EXPECT_EQ(differ, 0u) << "attention_block_forward lse: rows left at -inf" << what;
      EXPECT_CLOSE(got_lse, want_lse, floored(want_lse), "attention_block_forward lse" + what);
    }

    // The backward reads the forward's out and lse; both sides get the reference's, rounded.
    out = rounded<F>(out);
    lse = rounded<float>(lse);
    d_out.put(out);
    d_lse.put(lse);
    auto dout = random_of<F>(n_out);
    Dev<F> d_dout(dout);
    std::vector<double> delta(n_lse);
    Dev<float> d_delta(n_lse);
    gpu::attention_delta<F>(d_delta, d_dout, d_out, s.B, Tl, s.NH, s.hs, Cq);
    cpu::attention_delta<double>(delta.data(), dout.data(), out.data(), s.B, Tl, s.NH, s.hs, Cq);
    EXPECT_CLOSE(d_delta.fetch(), delta, floored(delta), "attention_delta" + shape);
    delta = rounded<float>(delta);
    d_delta.put(delta);

    auto dqkv = random_of<F>(n_qkv), dkv_off = random_of<F>(n_kv), dkv_diag = random_of<F>(n_kv);
    Dev<F> d_dqkv(dqkv), d_dkv_off(dkv_off), d_dkv_diag(dkv_diag);
    for (int diagonal = 0; diagonal < 2; diagonal++) {
      blk.diagonal = diagonal == 1;
      std::vector<double>& dkv = diagonal ? dkv_diag : dkv_off;
      gpu::attention_block_backward<F>(d_dqkv + q0, (diagonal ? d_dkv_diag : d_dkv_off) + k0,
                                       d_dout + o0, d_delta + l0, d_qkv + q0,
                                       (diagonal ? d_kv_diag : d_kv_off) + k0, d_lse + l0,
                                       on(true));
      cpu::attention_block_backward<double>(dqkv.data() + q0, dkv.data() + k0, dout.data() + o0,
                                            delta.data() + l0, qkv.data() + q0,
                                            (diagonal ? kv_diag : kv_off).data() + k0,
                                            lse.data() + l0, on(false));
    }
    EXPECT_CLOSE(d_dqkv.fetch(), dqkv, tolerance<F>(), "attention_block_backward dq" + shape);
    EXPECT_CLOSE(d_dkv_off.fetch(), dkv_off, tolerance<F>(),
                 "attention_block_backward dK/dV off-diagonal" + shape);
    EXPECT_CLOSE(d_dkv_diag.fetch(), dkv_diag, tolerance<F>(),
                 "attention_block_backward dK/dV diagonal" + shape);
  }
}

// The K/V columns of qkv rows packed into a block and a block's gradient added back, on rows of
// odd lengths; fill over a length off every block size.
TYPED_TEST(CudaBlock, Columns) {
  using F = TypeParam;
  const size_t rows = 37, ld = 45, at = 13, cols = 22;
  auto src = random_of<F>(rows * ld), block = random_of<F>(rows * cols);
  Dev<F> d_src(src), d_block(rows * cols);
  gpu::copy_columns<F>(d_block, cols, d_src + at, ld, rows, cols);
  std::vector<double> want(rows * cols);
  cpu::copy_columns<double>(want.data(), cols, src.data() + at, ld, rows, cols);
  EXPECT_EQ(d_block.fetch(), want) << "copy_columns";
  d_block.put(block);
  gpu::add_columns<F>(d_src + at, ld, d_block, cols, rows, cols);
  cpu::add_columns<double>(src.data() + at, ld, block.data(), cols, rows, cols);
  EXPECT_CLOSE(d_src.fetch(), rounded<F>(src), 0.0, "add_columns");

  const size_t n = 1003;
  Dev<float> d_x(n);
  gpu::fill(d_x, n, 0.5f);
  EXPECT_EQ(d_x.fetch(), std::vector<double>(n, 0.5)) << "fill";
}

}  // namespace
}  // namespace tessera::gpu_test
