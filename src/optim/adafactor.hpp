#pragma once
// Adafactor as an update rule (optim/rule.hpp; backend/adafactor.hpp gives the math): a matrix's
// second moment factored into exp_avg_sq_row [R] and exp_avg_sq_col [C], a vector's kept whole
// (exp_avg_sq), and with beta1 > 0 a first moment exp_avg like the parameters.
//
// Distributed: a rank holds pieces of a canonical matrix (a tensor-parallel block of it, cut
// further by a ZeRO-1 slice or ZeRO-2/3 parts). It adds the squares of the gradients it holds
// into canonical row and column sums (every matrix of its tile in one buffer), which are summed
// over tp and over the ZeRO group where that splits the buffer: every rank then holds the
// canonical sums, and updates the same statistics of every matrix of its tile. The update's RMS
// is summed per tensor the same way (a double per tensor). A tensor replicated over tp is
// counted on tp rank 0 only. Pipeline stages hold different tensors and sum nothing; the tied
// embedding's copies see the same gradients and take the same steps. Per step: one all-reduce of
// Σ(R + C) floats over tp and one over the ZeRO group, and one of a double per tensor each.
// Expert parallelism: each ep rank holds its experts' rows of a stacked expert matrix. Without
// ZeRO the sums are also summed over the ep group, where the dense tensors (copies on every ep
// rank) count on ep rank 0 only; by parts (ZeRO-1 with ep, 2, 3) the shard group, dp x cp,
// holds every element once (the dense parts spread over it, the experts' over edp in each ep
// rank) and its sum is the canonical one.
#include <string>
#include <utility>
#include <vector>

#include "optim/rule.hpp"

namespace tessera {

// The working buffers (RulePlan::work): the canonical row and column sums of every matrix of the
// tile, a row mean per tensor, and the update's Σ U² per tensor (twice: counted and not).
std::vector<std::pair<std::string, size_t>> adafactor_work(const LocalLayout& tile);

template <class Backend>
class AdafactorRule final : public UpdateRule<Backend> {
 public:
  AdafactorRule(const AdafactorHyper& hyper, const RuleSetup<Backend>& setup);
  // view.state: [exp_avg,] exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col (rule_state's order).
  void step(const StepView<Backend>& view, double lr, long t) override;

 private:
  // The part of a piece inside one block of its tensor: n elements from element `at` of the
  // piece, where `window` says.
  struct Window {
    size_t at = 0, n = 0;
    MatrixWindow window;
  };
  void add_sums(const StepView<Backend>& view);
  void reduce_rms(size_t tensors);

  AdafactorHyper h_;
  const LocalLayout& tile_;
  const std::vector<Piece>& pieces_;
  typename Backend::Comm* tp_;
  typename Backend::Comm* shard_;
  typename Backend::Comm* ep_;  // without ZeRO, with expert parallelism: the ep group
  int m_ = -1, v_, row_, col_;  // the state's places in view.state (m_ -1: no first moment)
  std::vector<size_t> row_at_, col_at_;  // by tile tensor: its sums in sums_ (matrices)
  size_t rows_total_ = 0, cols_total_ = 0;
  std::vector<char> counts_;  // by tile tensor: this rank's squares count in sums over tp
  std::vector<std::vector<Window>> windows_;  // by piece (matrices)
  float* sums_;
  float* row_mean_;
  double* rms_;
  std::vector<double> host_rms_;
};

}  // namespace tessera
