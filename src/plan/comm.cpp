#include "plan/comm.hpp"

#include <algorithm>
#include <cmath>

#include "model/cost.hpp"
#include "model/moe_dispatch.hpp"
#include "model/options.hpp"

namespace tessera {

namespace {

// The ranks an expert unit's ZeRO state splits over: a ZeRO group's holders of the same experts
// (edp without hybrid sharding; with whole experts the folded edp, tp x dp x cp / ep).
int experts_group(const ParallelLayout& l) {
  return l.experts_whole ? l.tp * l.dpcp() / l.ep : l.shard_size() / l.ep;
}

// The data-parallel payload and traffic (comm.hpp gives them by ZeRO stage).
void dp_bytes(const Config& cfg, const ModelShape& shape, const RunLayout& run, int pp_rank,
              uint64_t param_buffer, int act_bytes, CommBytes* out) {
  const ParallelLayout& l = run.layout;
  // The gradients' group is dp x cp (the ranks holding the same parameters).
  const int zero = cfg.parallel.zero, n = l.shard_size(), r = l.dpcp() / n;
  const double P = double(param_buffer), m = run.n_micro;
  auto ring = [](double payload, int ranks) {
    return ranks > 1 ? (ranks - 1.0) / ranks * payload : 0;
  };
  if (zero == 0 || (zero == 1 && n == 1) || (zero == 1 && l.ep > 1)) {
    // Expert parallelism: the experts' ranges sum over edp (once more than one rank holds them),
    // the rest over dp x cp (optim/distributed.cpp).
    // (The search plans thousands of layouts: a tile only where ep splits it.)
    const LocalLayout tile = l.ep > 1 ? rank_tile(run, shape, 0, pp_rank) : LocalLayout{};
    const double experts = double(tile.expert_elements());
    const int edp = (l.experts_whole ? l.tp : 1) * l.dpcp() / l.ep;
    out->dp_all_reduce = 4 * (P - experts);
    out->dp_experts = edp > 1 ? 4 * experts : 0;
    out->payload[Traffic::dp] = out->dp_all_reduce + out->dp_experts;
    out->dp_traffic = 2 * ring(out->dp_all_reduce, l.dpcp()) + 2 * ring(out->dp_experts, edp);
    if (zero == 0 || l.ep == 1) return;
    // ZeRO-1 with ep: the same sums, then every unit's updated parts (the master, or the bf16
    // copy) all-gathered over its group, the experts' over the ZeRO group's ranks holding the
    // same experts (edp, or n / ep with hybrid sharding); nothing for a group of one.
    const ShardPlan plan = make_shard_plan(tile, n, 0, experts_group(l), 0);
    for (size_t u = 0; u < tile.units.size(); ++u) {
      if (plan.group[u] == 1) continue;
      const double bytes = double(plan.whole(int(u))) * act_bytes;
      out->dp_sharded += bytes;
      out->dp_traffic += ring(bytes, plan.group[u]);
    }
    out->payload[Traffic::dp] += out->dp_sharded;
    return;
  }
  if (zero == 1) {
    const double slice = P / n;
    out->payload[Traffic::dp] = (n > 1 ? 8 * P : 0) + (r > 1 ? 4 * slice : 0);
    out->dp_traffic = ring(8 * P, n) + 2 * ring(4 * slice, r);
    out->dp_sharded = n > 1 ? 8 * P : 0;
    out->dp_all_reduce = r > 1 ? 4 * slice : 0;
    return;
  }
  const LocalLayout tile = rank_tile(run, shape, 0, pp_rank);
  // Expert parallelism: an MoE layer's experts are a unit of their own, sharded over the ZeRO
  // group's ranks holding the same experts (edp; n / ep with hybrid sharding).
  const ShardPlan plan = make_shard_plan(tile, n, 0, experts_group(l), 0);
  auto unit_of = [&](int tensor) { return tile.unit_of_tensor[size_t(tensor)]; };
  // A unit padded to its group's parts; nothing travels for a group of one.
  auto whole = [&](int u) { return plan.group[size_t(u)] > 1 ? double(plan.whole(u)) : 0.0; };
  // The bytes of a unit's gather: its elements, or under FP8 (ZeRO-3 resharding) a layer's
  // weights as one-byte codes beside its other elements packed (CodesUnit, model/shard.hpp).
  const bool keep = zero == 3 && !cfg.parallel.reshard_after_forward;
  const std::vector<CodesUnit> codes =
      zero == 3 && !keep && model_options(cfg).fp8.on ? fp8_codes_units(tile, plan)
                                                      : std::vector<CodesUnit>{};
  auto gather = [&](int u) {
    if (codes.empty() || codes[size_t(u)].weights.empty()) return whole(u) * act_bytes;
    return whole(u) > 0 ? whole(u) + double(plan.group[size_t(u)] * codes[size_t(u)].packed) *
                                         act_bytes
                        : 0.0;
  };
  double gathered = 0, reduced = 0;  // bytes gathered, elements reduced per micro-batch
  for (size_t c = 0; c < tile.chunks.size(); ++c) {
    const bool first = tile.first && c == 0, last = tile.last && c + 1 == tile.chunks.size();
    for (int k = tile.chunks[c].begin; k < tile.chunks[c].end; ++k) {
      // forward and backward
      gathered += 2 * gather(tile.layer_unit(k));
      reduced += whole(tile.layer_unit(k));
      if (tile.expert_unit(k) >= 0) {
        gathered += 2 * gather(tile.expert_unit(k));
        reduced += whole(tile.expert_unit(k));
      }
    }
    if (first) {  // the embedding's forward reads embed and positions; its backward none
      for (int t : {tile.embed, tile.positions})
        if (t >= 0) gathered += gather(unit_of(t)), reduced += whole(unit_of(t));
    }
    if (last) {  // forward: the final norm and the head; backward: the head and the norm's weight
      for (int t : {tile.norm_weight, tile.norm_bias})
        if (t >= 0) gathered += gather(unit_of(t)), reduced += whole(unit_of(t));
      gathered += 2 * gather(unit_of(tile.head)) + gather(unit_of(tile.norm_weight));
      reduced += whole(unit_of(tile.head));
    }
  }
  double every = 0;  // every unit once, bytes
  for (size_t u = 0; u < tile.units.size(); ++u) every += gather(int(u));
  const double gathers = zero == 2 ? every : keep ? every : m * gathered;
  const double payload = m * reduced * 4 + gathers;
  out->payload[Traffic::dp] = (n > 1 ? payload : 0) + (r > 1 ? 4.0 * double(plan.total) : 0);
  out->dp_traffic = ring(payload, n) + 2 * ring(4.0 * double(plan.total), r);
  out->dp_sharded = n > 1 ? payload : 0;
  out->dp_all_reduce = r > 1 ? 4.0 * double(plan.total) : 0;
}

}  // namespace

CommBytes comm_bytes(const Config& cfg, const ModelShape& shape, const RunLayout& run, int pp_rank,
                     uint64_t param_buffer, int act_bytes) {
  const ParallelLayout& l = run.layout;
  // T: this rank's tokens of each sequence (T / cp under context parallelism).
  const double b = run.micro_batch, T = double(cfg.data.seq_len) / l.cp, C = shape.n_embd;
  const double m = run.n_micro;
  double L = 0, moe = 0;
  for (const LayerRange& r : run.stage_chunks[size_t(pp_rank)]) {
    L += r.end - r.begin;
    moe += moe_layers(shape, r.begin, r.end);
  }
  const bool first = pp_rank == 0, last = pp_rank == l.pp - 1;
  const bool full = cfg.train.recompute == Recompute::Full;
  const bool sp = cfg.parallel.sequence_parallel && l.tp > 1;
  const double act = act_bytes * b * T * C;
  // The vocab-parallel cross-entropy: each row's max (fp32), its sum-exp and target logit (fp64).
  const double ce = 4 * b * T + 16 * b * T;
  CommBytes out;
  // tp, per micro-batch and layer, the collectives of the family's block (model/cost.hpp's
  // tp_collectives: 2 all-reduces forward and 2 backward, a full recompute's rerun 2 more); the
  // embedding's on the first stage, the head input's gradient and the loss's on the last.
  // Sequence parallelism: per layer 2 all-gathers and 2 reduce-scatters forward, 6 more backward
  // (2 of them re-gathering norm outputs for the weight gradients), 4 more for a rerun; once per
  // step the norms' partial weight gradients, fp32.
  const BlockCost cost = block_cost(shape, l.tp);
  if (l.tp > 1 && !sp) {
    out.payload[Traffic::tp] = m * (L * tp_collectives(cost, false, full) * act +
                                     (first ? act : 0) + (last ? act + ce : 0));
  } else if (sp) {
    // Whole experts (parallel.expert_tp = 1): an MoE layer's MLP section routes this rank's own
    // rows, no gather or reduce-scatter; its router statistics summed over tp instead, and the
    // router's gradient partial over tp as the norms'.
    const double whole = l.experts_whole ? moe : 0;
    out.payload[Traffic::tp] =
        m * ((L - whole / cost.sections) * tp_collectives(cost, true, full) * act +
             (first ? 2 * act : 0) + (last ? 3 * act + ce : 0));
    // (ZeRO-2/3 sum them in each micro-batch's unit buffers, before the reduce-scatter.)
    const double per_layer = layer_norm_params(shape), final_norm = final_norm_params(shape);
    const double router = double(shape.moe.experts) * C;
    out.payload[Traffic::tp] += 4 * (L * per_layer + whole * router + (last ? final_norm : 0)) *
                                (cfg.parallel.zero >= 2 ? m : 1);
    out.moe_stats_tp = m * whole * 8.0 * (2 * shape.moe.experts + 2) * (full ? 2 : 1);
    out.payload[Traffic::tp] += out.moe_stats_tp;
  }
  // model.qk_norm: each layer's q_norm and k_norm gradients, partial over tp (each rank's heads),
  // summed as the norms' are under sequence parallelism.
  if (l.tp > 1 && shape.qk_norm)
    out.payload[Traffic::tp] +=
        4 * L * 2.0 * shape.head_size() * (cfg.parallel.zero >= 2 ? m : 1);
  // An MoE layer's gates' gradient reads the whole expert output: each tp rank's partial dots
  // summed (model/moe_layer.hpp), this rank's b T tokens x top_k.
  if (l.tp > 1 && moe > 0 && !l.experts_whole) {
    out.moe_gates = m * moe * 4.0 * b * T * shape.moe.top_k;
    out.payload[Traffic::tp] += out.moe_gates;
  }
  if (l.dpcp() > 1) dp_bytes(cfg, shape, run, pp_rank, param_buffer, act_bytes, &out);
  // cp, per micro-batch and layer (model/context_attention.hpp): blocks of this rank's K/V
  // heads, b T 2 C_kv: the ring passes cp - 1 forward and 2 (cp - 1) backward, the all-gather
  // hands MPI cp-block buffers twice (forward, backward's re-gather) and reduce-scatters one;
  // a recompute reruns the forward's.
  if (l.cp > 1) {
    const double block = act_bytes * b * T * 2.0 * (shape.n_kv_head / l.tp) * shape.head_size();
    const bool ring = cfg.parallel.cp_comm != CpComm::AllGather;
    const double fwd = ring ? l.cp - 1.0 : l.cp, bwd = ring ? 2.0 * (l.cp - 1) : 2.0 * l.cp;
    const double rerun = cfg.train.recompute == Recompute::None ? 0 : fwd;
    out.payload[Traffic::cp] = m * L * block * (fwd + bwd + rerun);
    // An MoE layer's balancing losses read the whole micro-batch's router statistics.
    out.moe_stats = m * moe * 8.0 * (2 * shape.moe.experts + 2) * (full ? 2 : 1);
    out.payload[Traffic::cp] += out.moe_stats;
  }
  // ep: the all-to-alls of the rows routed to the other ep ranks' experts (comm.hpp).
  if (l.ep > 1 && moe > 0) {
    const MoeShape& e = shape.moe;
    const int N = int(b * T) / (l.experts_whole ? l.tp : 1);  // the rows this rank routes
    const double per_expert = std::min(double(N) * e.top_k / e.experts,
                                       double(moe_capacity(cfg.model.moe.capacity_factor, N,
                                                           e.top_k, e.experts)));
    const double sent = per_expert * e.experts * (l.ep - 1.0) / l.ep;
    out.ep_exchanges = moe * (full ? 6 : 4);
    out.payload[Traffic::ep] = m * out.ep_exchanges * sent * C * act_bytes;
  }
  // pp: each (micro-batch, chunk) sends its output forward and its input's gradient back, except
  // at the model's two ends; sequence parallelism sends this rank's rows only.
  if (l.pp > 1) {
    const double v = run.virtual_stages;
    out.payload[Traffic::pp] =
        m * (sp ? act / l.tp : act) * ((v - (last ? 1 : 0)) + (v - (first ? 1 : 0)));
  }
  // embed: the tied embedding's fp32 gradient, summed between the first and last stage (under
  // ZeRO-2/3 this rank's part of it).
  if (l.pp > 1 && shape.tied && (first || last)) {
    const double rows = double(shape.padded_vocab) * C / l.tp, g = l.shard_size();
    out.payload[Traffic::embed] = 4.0 * (cfg.parallel.zero >= 2 ? std::ceil(rows / g) : rows);
  }
  return out;
}

double pipeline_bubble(const RunLayout& run) {
  const double pp = run.layout.pp;
  return (pp - 1) / (run.virtual_stages * run.n_micro + pp - 1);
}

}  // namespace tessera
