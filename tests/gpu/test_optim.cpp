// Adafactor's ops (backend/cuda/adafactor.cu) against the CPU's (backend/cpu/adafactor.cpp) on
// the same inputs: a piece of a matrix that starts in mid-row of a block sitting inside a larger
// canonical matrix (as a tp block cut by a ZeRO-1 slice is), every op of a step in turn; and a
// vector's second moment. tests/unit/test_optim.cpp holds the CPU ops to the rule in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

namespace cpu = tessera::cpu;
namespace gpu = tessera::cuda;

std::vector<float> floats(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> doubles(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Σ U² sums in double terms computed in float, from second moments updated in float: nvcc fuses
// their multiply-adds and the host compiler need not, so each term may differ by a few float
// ulps between the two (the emulator, compiled as host code, agrees to the last bit; an H200
// differed by 3.2e-9 of the sum). The terms are positive, so the sum keeps the terms' relative
// bound: 8 ulps of a float.
constexpr double kFloatTerms = 8 * 0x1p-24;

TEST(CudaOptim, AdafactorMatrixPiece) {
  // Canonical [50, 40]; the block holds rows 3.. and columns 4..32 (29 wide, 37 rows); the piece
  // starts 5 elements into the block and stops 11 before its end.
  const size_t R = 50, C = 40, cols = 29, rows = 37, first = 5, n = rows * cols - first - 11;
  const MatrixWindow w{first, cols, 3, 4};
  AdafactorHyper h;
  h.weight_decay = 0.1;
  for (size_t offset : {size_t(0), size_t(1)}) {
    const std::string what = " offset=" + std::to_string(offset);
    auto g = random_of<float>(n, -0.05, 0.05), p = random_of<float>(n);
    auto m = random_of<float>(n, -0.01, 0.01);
    auto row = random_of<float>(R, 1e-4, 2e-3), col = random_of<float>(C, 1e-4, 2e-3);
    const std::vector<double> zero_r(R, 0.0), zero_c(C, 0.0);
    Dev<float> d_g(g, offset), d_p(p, offset), d_m(m, offset), d_row(row), d_col(col);
    Dev<float> d_rs(zero_r), d_cs(zero_c), d_mean(1);
    Dev<bf16> d_copy(n, offset);
    std::vector<float> gf = floats(g), pf = floats(p), mf = floats(m), rowf = floats(row),
                       colf = floats(col), rs(R, 0.0f), cs(C, 0.0f);
    // 1. The piece's squares by canonical row and column.
    gpu::adafactor_sums(d_rs.get(), d_cs.get(), d_g.get(), n, w);
    cpu::adafactor_sums(rs.data(), cs.data(), gf.data(), n, w);
    EXPECT_CLOSE(d_rs.fetch(), doubles(rs), 1e-6, "adafactor_sums rows" + what);
    EXPECT_CLOSE(d_cs.fetch(), doubles(cs), 1e-6, "adafactor_sums columns" + what);
    // 2. The statistics (from the same sums on both) and their row mean, at step 3.
    float mean = 0;
    d_rs.put(doubles(rs));
    d_cs.put(doubles(cs));
    gpu::adafactor_factors(d_row.get(), d_col.get(), d_mean.get(), d_rs.get(), d_cs.get(), R, C,
                           h, 3);
    cpu::adafactor_factors(rowf.data(), colf.data(), &mean, rs.data(), cs.data(), R, C, h, 3);
    EXPECT_CLOSE(d_row.fetch(), doubles(rowf), 1e-6, "adafactor_factors rows" + what);
    EXPECT_CLOSE(d_col.fetch(), doubles(colf), 1e-6, "adafactor_factors columns" + what);
    EXPECT_CLOSE(d_mean.fetch(), std::vector<double>{mean}, 1e-6, "row mean" + what);
    d_row.put(doubles(rowf));
    d_col.put(doubles(colf));
    d_mean.put({mean});
    // 3. Σ U² added to what the accumulator held.
    SecondMoment sg{d_row.get(), d_col.get(), d_mean.get(), w, nullptr};
    SecondMoment sc{rowf.data(), colf.data(), &mean, w, nullptr};
    Dev<double> acc(std::vector<double>{0.5});
    double want = 0.5;
    gpu::adafactor_rms(acc.get(), d_g.get(), sg, n, h, 3);
    cpu::adafactor_rms(&want, gf.data(), sc, n, h, 3);
    EXPECT_NEAR(acc.fetch()[0], want, kFloatTerms * (want - 0.5)) << "adafactor_rms" << what;
    // 4. The update with the first moment, decay and a bf16 copy.
    gpu::adafactor_update(d_p.get(), d_copy.get(), d_g.get(), d_m.get(), sg, n, true, h, 3e-3,
                          0.7f);
    cpu::adafactor_update(pf.data(), nullptr, gf.data(), mf.data(), sc, n, true, h, 3e-3, 0.7f);
    EXPECT_CLOSE(d_p.fetch(), doubles(pf), 1e-6, "adafactor_update params" + what);
    EXPECT_CLOSE(d_m.fetch(), doubles(mf), 1e-6, "adafactor_update m" + what);
    EXPECT_CLOSE(d_copy.fetch(), rounded<bf16>(doubles(pf)), 2e-2, "adafactor bf16 copy" + what);
  }
}

TEST(CudaOptim, AdafactorVector) {
  const size_t n = 1003;
  AdafactorHyper h;
  h.beta1 = 0;
  for (size_t offset : {size_t(0), size_t(1)}) {
    const std::string what = " offset=" + std::to_string(offset);
    auto g = random_of<float>(n, -0.05, 0.05), p = random_of<float>(n);
    auto v = random_of<float>(n, 1e-5, 1e-3);
    Dev<float> d_g(g, offset), d_p(p, offset), d_v(v, offset);
    std::vector<float> gf = floats(g), pf = floats(p), vf = floats(v);
    SecondMoment sg, sc;
    sg.v = d_v.get();
    sc.v = vf.data();
    Dev<double> acc(std::vector<double>{0.0});
    double want = 0;
    gpu::adafactor_rms(acc.get(), d_g.get(), sg, n, h, 5);
    cpu::adafactor_rms(&want, gf.data(), sc, n, h, 5);
    EXPECT_CLOSE(d_v.fetch(), doubles(vf), 1e-6, "adafactor_rms v" + what);
    EXPECT_NEAR(acc.fetch()[0], want, kFloatTerms * want) << "adafactor_rms vector" << what;
    gpu::adafactor_update(d_p.get(), static_cast<float*>(nullptr), d_g.get(), nullptr, sg, n,
                          false, h, 3e-3, 1.0f);
    cpu::adafactor_update(pf.data(), nullptr, gf.data(), nullptr, sc, n, false, h, 3e-3, 1.0f);
    EXPECT_CLOSE(d_p.fetch(), doubles(pf), 1e-6, "adafactor_update vector" + what);
  }
}

}  // namespace
}  // namespace tessera::gpu_test
