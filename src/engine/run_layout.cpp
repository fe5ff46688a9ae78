#include "engine/run_layout.hpp"

#include <algorithm>

namespace tessera {

namespace {

// Whole experts on every tp rank (parallel.expert_tp = 1): each tp rank routes its own rows.
std::string whole_experts_problem(const Config& cfg, const ParallelLayout& layout) {
  if (!layout.experts_whole) return "";
  const std::string whole = "parallel.expert_tp = 1 with parallel.tp = " +
                            std::to_string(layout.tp);
  const MoeConfig& m = cfg.model.moe;
  if (!cfg.parallel.sequence_parallel)
    return whole + " needs parallel.sequence_parallel: true (each tp rank routes its own rows)";
  if (m.capacity_factor > 0)
    return whole + " and model.moe.capacity_factor = " + std::to_string(m.capacity_factor) +
           ": each tp rank would drop its own rows' choices; use a dropless model";
  if (m.shared_experts > 0)
    return whole + " and model.moe.shared_experts = " + std::to_string(m.shared_experts) +
           ": not combined yet (docs/status.md)";
  if (cfg.optim.name == OptimRule::Adafactor)
    return whole + " and optim.name: adafactor: not combined yet (docs/status.md)";
  if (cfg.device.precision == Precision::Fp8)
    return whole + " and device.precision: fp8: not combined yet (docs/status.md)";
  return "";
}

// What the mixture-of-experts layers do not run on yet, and their splits over tp.
std::string moe_layout_problem(const Config& cfg, const ModelShape& shape,
                               const ParallelLayout& layout) {
  const MoeConfig& m = cfg.model.moe;
  if (m.experts == 0) return "";
  const std::string moe = "model.moe.experts = " + std::to_string(m.experts);
  if (std::string e = check_expert_groups(layout); !e.empty()) return e;
  if (cfg.parallel.expert_tp > 1 && cfg.parallel.expert_tp != layout.tp)
    return "parallel.expert_tp = " + std::to_string(cfg.parallel.expert_tp) +
           " must be 1 (whole experts on every tp rank) or parallel.tp = " +
           std::to_string(layout.tp) + " (each expert split as the dense MLP)";
  if (std::string e = whole_experts_problem(cfg, layout); !e.empty()) return e;
  if (!layout.experts_whole && shape.moe.ffn % layout.tp != 0)
    return "parallel.tp = " + std::to_string(layout.tp) + " does not divide model.moe.ffn = " +
           std::to_string(shape.moe.ffn) + " (every expert splits over tp as the dense MLP)";
  // A capacity bounds an expert's rows per rank and micro-batch: with the micro-batch's tokens
  // cut over cp ranks, each would drop differently from one rank.
  if (m.capacity_factor > 0 && layout.cp > 1)
    return "model.moe.capacity_factor = " + std::to_string(m.capacity_factor) +
           " bounds each expert per rank's tokens, which parallel.cp = " +
           std::to_string(layout.cp) + " cuts; use a dropless model (capacity_factor 0) with cp";
  return "";
}

}  // namespace

std::string make_run_layout(const Config& cfg, const ModelShape& shape,
                            const ParallelLayout& layout, RunLayout* out) {
  if (std::string e = moe_layout_problem(cfg, shape, layout); !e.empty()) return e;
  const int T = cfg.data.seq_len, B = cfg.train.batch_size;
  const int mb = cfg.train.micro_batch > 0 ? cfg.train.micro_batch : B / layout.dp;
  if (std::string e = check_layout(layout, shape.n_head, shape.padded_vocab, shape.n_layer,
                                   cfg.parallel.stage_layers, B, mb);
      !e.empty())
    return e;
  // The model's other tensor-parallel splits (the deck checks them where tp is given, not auto).
  if (shape.n_kv_head % layout.tp != 0)
    return "parallel.tp = " + std::to_string(layout.tp) + " does not divide model.n_kv_head = " +
           std::to_string(shape.n_kv_head) + " (each rank needs whole key/value heads)";
  if (layout.cp > 1 && T % (2LL * layout.cp) != 0)
    return "data.seq_len = " + std::to_string(T) + " is not divisible by 2 x parallel.cp = " +
           std::to_string(2LL * layout.cp) + " (each sequence is cut into 2 x cp equal chunks)";
  const int Tl = T / layout.cp;  // each rank's tokens of a sequence
  // Products of deck values in 64 bits: each may be near the int's limit on its own.
  const long long rows = static_cast<long long>(mb) * Tl;
  if (cfg.parallel.sequence_parallel && layout.tp > 1 && rows % layout.tp != 0)
    return "parallel.sequence_parallel splits the " + std::to_string(rows) +
           " rows of a micro-batch (train.micro_batch x data.seq_len / parallel.cp) over "
           "parallel.tp = " + std::to_string(layout.tp) + ", which does not divide them";
  if (shape.ffn_hidden % layout.tp != 0)
    return "parallel.tp = " + std::to_string(layout.tp) + " does not divide model.ffn_hidden = " +
           std::to_string(shape.ffn_hidden);
  const int n_micro = int(B / (static_cast<long long>(layout.dp) * mb));
  // Virtual stages: the rules the deck could not check before pp and the micro-batches were known.
  const int v = cfg.parallel.virtual_stages;
  if (v > 1 && layout.pp < 2)
    return "parallel.virtual_stages = " + std::to_string(v) +
           " needs parallel.pp >= 2 (one stage has nothing to interleave)";
  if (v > 1 && shape.n_layer % (static_cast<long long>(layout.pp) * v) != 0)
    return "parallel.virtual_stages = " + std::to_string(v) +
           " does not divide the layers of each stage (model.n_layer = " +
           std::to_string(shape.n_layer) + " over parallel.pp = " + std::to_string(layout.pp) +
           ")";
  if (v > 1 && n_micro % layout.pp != 0)
    return "parallel.virtual_stages = " + std::to_string(v) +
           " runs micro-batches in groups of parallel.pp = " + std::to_string(layout.pp) +
           ", but a step has " + std::to_string(n_micro) +
           " per dp rank (train.batch_size / (dp x train.micro_batch))";
  out->layout = layout;
  out->micro_batch = mb;
  out->n_micro = n_micro;
  out->virtual_stages = v;
  // Each stage's layer chunks: virtual stage k = chunk * pp + stage holds the k-th of pp * v
  // equal ranges (v = 1: the stage's balanced or given range).
  const auto ranges = stage_layer_ranges(
      shape.n_layer, layout.pp * v, v > 1 ? std::vector<int>{} : cfg.parallel.stage_layers);
  out->stage_chunks.assign(size_t(layout.pp), {});
  for (int k = 0; k < layout.pp * v; ++k)
    out->stage_chunks[size_t(k % layout.pp)].push_back(
        {ranges[size_t(k)].first, ranges[size_t(k)].second});
  return "";
}

LocalLayout rank_tile(const RunLayout& run, const ModelShape& shape, int tp_rank, int pp_rank,
                      int ep_rank) {
  return make_local_layout(shape, run.layout.tp, tp_rank, run.stage_chunks[size_t(pp_rank)],
                           pp_rank == 0, pp_rank == run.layout.pp - 1, run.layout.ep, ep_rank,
                           run.layout.experts_whole);
}

std::vector<Action> rank_schedule(const Config& cfg, const RunLayout& run, int pp_rank) {
  return make_schedule(cfg.parallel.schedule, pp_rank, run.layout.pp,
                       run.n_micro, run.virtual_stages);
}

OptimHyper optim_hyper(const OptimConfig& o) {
  OptimHyper h{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}};
  h.rule = o.name;
  h.adafactor = {o.beta1, o.adafactor_decay, o.adafactor_eps, o.adafactor_clip, o.weight_decay};
  return h;
}

EngineSetup engine_setup(const Config& cfg, const RunLayout& run, const LocalLayout& tile,
                         int pp_rank) {
  const OptimHyper hyper = optim_hyper(cfg.optim);
  return {.tile = tile,
          .mesh = nullptr,
          .schedule = rank_schedule(cfg, run, pp_rank),
          .micro_batch = run.micro_batch,
          .seq_len = cfg.data.seq_len / run.layout.cp,
          .n_micro = run.n_micro,
          .zero = cfg.parallel.zero,
          .embed_sum = run.layout.pp > 1 && tile.canonical.shape.tied,
          .hyper = hyper,
          .model = model_options(cfg),
          .reshard_after_forward = cfg.parallel.reshard_after_forward,
          .zero_prefetch = cfg.parallel.zero_prefetch,
          .nccl_overlap = cfg.device.nccl_overlap,
          .breakdown = cfg.log.breakdown};
}

uint64_t loader_ring_bytes(const Config& cfg, const RunLayout& run) {
  return uint64_t(std::max(cfg.data.prefetch, 1)) * uint64_t(run.n_micro) *
         uint64_t(run.micro_batch) * uint64_t(cfg.data.seq_len) * 2 * sizeof(int32_t);
}

}  // namespace tessera
