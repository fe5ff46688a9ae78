#include "model/cost.hpp"

#include "model/param_layout.hpp"

namespace tessera {

BlockCost block_cost(const ModelShape& s, int tp) {
  BlockCost c;
  const BlockWidths& w = c.width = block_widths(s, tp);
  const int C = s.n_embd;
  // q, k and v (column-parallel), the attention's output projection (row-parallel), the MLP's
  // fc1 (column-parallel) and fc2 (row-parallel): the dense MLP kinds differ only in fc1's width.
  c.gemms = {{Fp8State::kQkv, kQkvW, w.qkv, C},
             {Fp8State::kProj, kProjW, C, w.q},
             {Fp8State::kFc1, kFc1W, w.fc1, C},
             {Fp8State::kFc2, kFc2W, C, w.f}};
  c.residual_elems = 2 * 2 * double(C) + 2 * 3 * double(C);
  c.gemm_out_elems = 2 * (double(w.qkv) + C + w.fc1);
  c.activation_elems = 2 * double(w.f);
  c.activation_exps = w.f;
  return c;
}

int tp_collectives(const BlockCost& cost, bool sequence_parallel, bool full_recompute) {
  const int per_pass = sequence_parallel ? 2 : 1;  // forward, or a rerun
  const int backward = sequence_parallel ? 3 : 1;
  return cost.sections * (per_pass * (full_recompute ? 2 : 1) + backward);
}

double layer_matmul_params(const ModelShape& s) {
  double n = 0;
  for (const LayerParam& p : layer_params(s, -1))
    if (p.shape.size() == 2) n += double(p.shape[0]) * double(p.shape[1]);
  return n;
}

double active_matmul_params(const ModelShape& s) {
  double n = 0;
  for (int l = 0; l < s.n_layer; ++l)
    for (const LayerParam& p : layer_params(s, l)) {
      if (p.shape.size() != 2) continue;
      const double all = double(p.shape[0]) * double(p.shape[1]);
      const bool expert = p.role == kExpertFc1W || p.role == kExpertFc2W;
      n += expert ? all * s.moe.top_k / s.moe.experts : all;
    }
  return n;
}

double layer_norm_params(const ModelShape& s) {
  double n = 0;
  for (const LayerParam& p : layer_params(s, -1))
    if (p.role == kNorm1W || p.role == kNorm1B || p.role == kNorm2W || p.role == kNorm2B)
      n += double(p.shape[0]);
  return n;
}

double final_norm_params(const ModelShape& s) {
  std::vector<LayerParam> norm;
  norm_params(family(s.arch), "", size_t(s.n_embd), &norm);
  double n = 0;
  for (const LayerParam& p : norm) n += double(p.shape[0]);
  return n;
}

}  // namespace tessera
