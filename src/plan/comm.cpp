#include "plan/comm.hpp"

namespace tessera {

CommBytes comm_bytes(const Config& cfg, const ModelShape& shape, const RunLayout& run, int pp_rank,
                     uint64_t param_buffer, int act_bytes) {
  const ParallelLayout& l = run.layout;
  const double b = run.micro_batch, T = cfg.data.seq_len, C = shape.n_embd;
  const double m = run.n_micro;
  double L = 0;
  for (const LayerRange& r : run.stage_chunks[size_t(pp_rank)]) L += r.end - r.begin;
  const bool first = pp_rank == 0, last = pp_rank == l.pp - 1;
  const bool llama = shape.arch == Arch::Llama;
  const bool full = cfg.train.recompute == "full";
  const bool sp = cfg.parallel.sequence_parallel && l.tp > 1;
  const double act = act_bytes * b * T * C;
  // The vocab-parallel cross-entropy: each row's max (fp32), its sum-exp and target logit (fp64).
  const double ce = 4 * b * T + 16 * b * T;
  CommBytes out;
  // tp, per micro-batch and layer: 2 all-reduces forward and 2 backward (a full recompute's rerun
  // 2 more); the embedding's on the first stage, the head input's gradient and the loss's on the
  // last. Sequence parallelism: per layer 2 all-gathers and 2 reduce-scatters forward, 6 more
  // backward (2 of them re-gathering norm outputs for the weight gradients), 4 more for a rerun;
  // once per step the norms' partial weight gradients, fp32.
  if (l.tp > 1 && !sp) {
    out.tp = m * (L * (full ? 6 : 4) * act + (first ? act : 0) + (last ? act + ce : 0));
  } else if (sp) {
    out.tp = m * (L * (full ? 14 : 10) * act + (first ? 2 * act : 0) + (last ? 3 * act + ce : 0));
    const double per_layer = llama ? 2 * C : 4 * C, final_norm = llama ? C : 2 * C;
    out.tp += 4 * (L * per_layer + (last ? final_norm : 0));
  }
  // dp: the fp32 gradient buffer, all-reduced or reduce-scattered then (the parameters)
  // all-gathered under ZeRO-1.
  if (l.dp > 1) out.dp = 4.0 * double(param_buffer) * (cfg.parallel.zero == 1 ? 2 : 1);
  // pp: each (micro-batch, chunk) sends its output forward and its input's gradient back, except
  // at the model's two ends; sequence parallelism sends this rank's rows only.
  if (l.pp > 1) {
    const double v = run.virtual_stages;
    out.pp = m * (sp ? act / l.tp : act) * ((v - (last ? 1 : 0)) + (v - (first ? 1 : 0)));
  }
  // embed: the tied embedding's fp32 gradient, summed between the first and last stage.
  if (l.pp > 1 && shape.tied && (first || last))
    out.embed = 4.0 * double(shape.padded_vocab) * C / l.tp;
  return out;
}

double pipeline_bubble(const RunLayout& run) {
  const double pp = run.layout.pp;
  return (pp - 1) / (run.virtual_stages * run.n_micro + pp - 1);
}

}  // namespace tessera
