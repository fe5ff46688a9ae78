#include "optim/adafactor.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backend/cpu/backend.hpp"
#include "model/family.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

namespace {

bool is_matrix(const LocalLayout& tile, const LocalTensor& t) {
  return tile.canon(t).shape.size() == 2;
}

}  // namespace

std::vector<std::pair<std::string, size_t>> adafactor_work(const LocalLayout& tile) {
  size_t stats = 0;
  for (const LocalTensor& t : tile.tensors)
    if (is_matrix(tile, t)) stats += tile.canon(t).shape[0] + tile.canon(t).shape[1];
  const size_t n = tile.tensors.size();
  return {{"Adafactor row and column sums (fp32)", stats * sizeof(float)},
          {"Adafactor row means (fp32)", n * sizeof(float)},
          {"Adafactor update RMS sums (fp64)", 2 * n * sizeof(double)}};
}

template <class Backend>
AdafactorRule<Backend>::AdafactorRule(const AdafactorHyper& hyper,
                                      const RuleSetup<Backend>& setup)
    : h_(hyper), tile_(*setup.tile), pieces_(*setup.pieces), tp_(setup.tp), shard_(setup.shard),
      ep_(setup.ep),
      sums_(static_cast<float*>(setup.work[0])), row_mean_(static_cast<float*>(setup.work[1])),
      rms_(static_cast<double*>(setup.work[2])) {
  if (h_.beta1 > 0) m_ = 0;
  v_ = m_ + 1;
  row_ = v_ + 1;
  col_ = v_ + 2;
  const size_t n = tile_.tensors.size();
  row_at_.assign(n, 0);
  col_at_.assign(n, 0);
  counts_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const LocalTensor& t = tile_.tensors[i];
    const ParamTensor& c = tile_.canon(t);
    // Split over tp (each rank holds other elements), or its tp rank 0's copy; an expert tensor
    // holds 1 / ep of the canonical rows before tp. Summed over ep, a dense tensor's copies on
    // the other ep ranks stay out.
    const bool expert = expert_role(c.role);
    const size_t held = expert ? t.numel * size_t(tile_.ep) : t.numel;
    counts_[i] = (tile_.tp == 1 || tile_.tp_rank == 0 || held < c.numel) &&
                 (!ep_ || expert || tile_.ep_rank == 0);
    if (!is_matrix(tile_, t)) continue;
    row_at_[i] = rows_total_;
    col_at_[i] = cols_total_;
    rows_total_ += c.shape[0];
    cols_total_ += c.shape[1];
  }
  // Each piece of a matrix cut at its tensor's blocks (stacked by local rows, model/shard.hpp).
  windows_.resize(pieces_.size());
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const LocalTensor& t = tile_.tensors[size_t(pieces_[p].tensor)];
    if (!is_matrix(tile_, t)) continue;
    const size_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    const size_t begin = pieces_[p].local - t.offset, end = begin + pieces_[p].n;
    size_t row = 0;  // the block's first local row
    for (const Block& b : t.blocks) {
      if (b.cols != cols) throw std::logic_error("Adafactor: a block narrower than its tensor");
      const size_t lo = std::max(begin, row * cols), hi = std::min(end, (row + b.rows) * cols);
      if (lo < hi) windows_[p].push_back({lo - begin, hi - lo, {lo - row * cols, cols, b.row0, b.col0}});
      row += b.rows;
    }
  }
  host_rms_.resize(2 * n);
}

// Σ g² by canonical row and column of every matrix over the pieces this rank counts, summed
// over the ranks that split the matrices: the canonical sums on every rank.
template <class Backend>
void AdafactorRule<Backend>::add_sums(const StepView<Backend>& view) {
  const size_t stats = rows_total_ + cols_total_;
  Backend::zero(sums_, stats * sizeof(float));
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const size_t i = size_t(pieces_[p].tensor);
    if (!counts_[i]) continue;
    for (const Window& w : windows_[p])
      Backend::adafactor_sums(sums_ + row_at_[i], sums_ + rows_total_ + col_at_[i],
                              view.grads[p] + w.at, w.n, w.window);
  }
  if (stats == 0) return;
  tp_->all_reduce_sum(sums_, stats);
  if (shard_) shard_->all_reduce_sum(sums_, stats);
  if (ep_) ep_->all_reduce_sum(sums_, stats);
}

// The counted Σ U² of every tensor to the host, summed over tp and the ZeRO group or ep (host
// MPI).
template <class Backend>
void AdafactorRule<Backend>::reduce_rms(size_t tensors) {
  Backend::to_host(host_rms_.data(), rms_, tensors * sizeof(double));
  for (auto* comm : {tp_, shard_, ep_})
    if (comm && comm->active())
      MPI_Allreduce(MPI_IN_PLACE, host_rms_.data(), int(tensors), MPI_DOUBLE, MPI_SUM,
                    comm->mpi());
}

template <class Backend>
void AdafactorRule<Backend>::step(const StepView<Backend>& view, double lr, long t) {
  const auto& state = *view.state;
  const size_t n = tile_.tensors.size();
  add_sums(view);
  for (size_t i = 0; i < n; ++i) {
    const LocalTensor& tensor = tile_.tensors[i];
    if (!is_matrix(tile_, tensor)) continue;
    const ParamTensor& c = tile_.canon(tensor);
    Backend::adafactor_factors(state[size_t(row_)][i], state[size_t(col_)][i], row_mean_ + i,
                               sums_ + row_at_[i], sums_ + rows_total_ + col_at_[i], c.shape[0],
                               c.shape[1], h_, t);
  }
  // The estimate a piece reads: its matrix's statistics where its window says, or its v.
  auto moment = [&](size_t p, const Window* w) {
    const size_t i = size_t(pieces_[p].tensor);
    SecondMoment s;
    if (w) {
      s.row = state[size_t(row_)][i];
      s.col = state[size_t(col_)][i];
      s.row_mean = row_mean_ + i;
      s.window = w->window;
    } else {
      s.v = state[size_t(v_)][p];
    }
    return s;
  };
  Backend::zero(rms_, 2 * n * sizeof(double));
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const size_t i = size_t(pieces_[p].tensor);
    double* acc = rms_ + (counts_[i] ? i : n + i);  // an uncounted copy still updates its v
    if (windows_[p].empty() && !is_matrix(tile_, tile_.tensors[i]))
      Backend::adafactor_rms(acc, view.grads[p], moment(p, nullptr), pieces_[p].n, h_, t);
    for (const Window& w : windows_[p])
      Backend::adafactor_rms(acc, view.grads[p] + w.at, moment(p, &w), w.n, h_, t);
  }
  reduce_rms(n);
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const size_t i = size_t(pieces_[p].tensor);
    const ParamTensor& c = tile_.canon(tile_.tensors[i]);
    const double rms = std::sqrt(host_rms_[i] / double(c.numel));
    const float inv_clip = float(1.0 / std::max(1.0, rms / h_.clip_threshold));
    float* m = m_ >= 0 ? state[size_t(m_)][p] : nullptr;
    auto* copy = view.copy[p];
    if (!is_matrix(tile_, tile_.tensors[i]))
      Backend::adafactor_update(view.master[p], copy, view.grads[p], m, moment(p, nullptr),
                                pieces_[p].n, c.weight_decay, h_, lr, inv_clip);
    for (const Window& w : windows_[p])
      Backend::adafactor_update(view.master[p] + w.at, copy ? copy + w.at : nullptr,
                                view.grads[p] + w.at, m ? m + w.at : nullptr, moment(p, &w), w.n,
                                c.weight_decay, h_, lr, inv_clip);
  }
}

template class AdafactorRule<CpuBackend>;
#ifdef TESSERA_CUDA
template class AdafactorRule<CudaBackend<float>>;
template class AdafactorRule<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
