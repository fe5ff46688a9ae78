#include "model/cost.hpp"

#include "model/param_layout.hpp"

namespace tessera {

BlockCost block_cost(const ModelShape& s, int tp, bool moe) {
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
  // model.qk_norm: one more pass over the q and k heads (read, and written twice: the norm's
  // output and the raw copy the backward reads), one more launch.
  const double qk = s.qk_norm ? 3.0 * double(w.nh + w.nkv) * w.hs : 0;
  c.gemm_out_elems = 2 * (double(w.qkv) + C + w.fc1) + qk;
  c.activation_elems = 2 * double(w.f);
  c.activation_exps = w.f;
  c.forward_kernels += s.qk_norm ? 1 : 0;
  if (!moe) return c;
  // The experts' fc1, activation and fc2 on k rows a token; the dense MLP's three launches
  // replaced by the router's and dispatch's seven and each expert's three.
  MoeCost& m = c.moe;
  m.experts = s.moe.experts;
  m.top_k = s.moe.top_k;
  const double k = m.top_k, E = m.experts;
  m.router = {-1, kRouterW, m.experts, C};
  m.expert = {{-1, kExpertFc1W, w.efc1, C}, {-1, kExpertFc2W, C, w.ef}};
  m.dispatch_elems = 2 * (2 * k * C);
  m.route_elems = 2 * E;
  m.route_exps = E;
  m.forward_kernels = 7 + 3 * m.experts;
  c.gemm_out_elems = 2 * (double(w.qkv) + C + k * w.efc1) + qk;
  c.activation_elems = 2 * k * w.ef;
  c.activation_exps = k * w.ef;
  c.forward_kernels += m.forward_kernels - 3;
  if (s.moe.shared == 0) {
    c.gemms.resize(2);
    return c;
  }
  // The shared experts: the dense MLP's GEMMs, activation and three launches at their width, on
  // every row.
  c.gemms[2].out = w.sfc1;
  c.gemms[3].in = w.sf;
  c.gemm_out_elems += 2 * double(w.sfc1);
  c.activation_elems += 2 * double(w.sf);
  c.activation_exps += w.sf;
  c.forward_kernels += 3;
  return c;
}

int moe_layers(const ModelShape& s, int begin, int end) {
  int n = 0;
  for (int l = begin; l < end; ++l) n += s.moe.layer(l) ? 1 : 0;
  return n;
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
  // Each kind of layer's table once (dense, MoE), times its layers.
  int moe_layers = 0;
  for (int l = 0; l < s.n_layer; ++l) moe_layers += s.moe.layer(l) ? 1 : 0;
  auto active = [&](int l) {
    double n = 0;
    for (const LayerParam& p : layer_params(s, l)) {
      if (p.shape.size() != 2) continue;
      const double all = double(p.shape[0]) * double(p.shape[1]);
      const bool expert = p.role == kExpertFc1W || p.role == kExpertFc2W;
      n += expert ? all * s.moe.top_k / s.moe.experts : all;
    }
    return n;
  };
  int first_moe = -1;
  for (int l = 0; l < s.n_layer && first_moe < 0; ++l)
    if (s.moe.layer(l)) first_moe = l;
  const double dense = (s.n_layer - moe_layers) * active(-1);
  return dense + (moe_layers > 0 ? moe_layers * active(first_moe) : 0);
}

ParamCounts param_counts(const ModelShape& s) {
  ParamCounts c;
  const ParamLayout p = make_param_layout(s);
  for (const ParamTensor& t : p.tensors) {
    const double n = double(t.numel);
    const bool expert = expert_role(t.role);
    c.total += n;
    c.expert += expert ? n : 0;
    c.active += expert ? n * s.moe.top_k / s.moe.experts : n;
  }
  return c;
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
