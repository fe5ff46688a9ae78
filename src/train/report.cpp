// What a run says (train/run.hpp): the start-up lines (the model, the layout and each rank's
// place in it, memory, data, where the parameters came from, the peak MFU is measured against),
// each logged step's line and metrics.jsonl row, and at the end one row per rank of its memory,
// its bytes per step on each communicator and its pipeline bubble.
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "backend/peak.hpp"
#include "model/cost.hpp"
#include "train/run.hpp"

namespace tessera {

void Run::announce() {
  announce_model();
  announce_data();
  announce_start();
  measure_peak();
}

void Run::announce_model() {
  const ParallelLayout& layout = run_.layout;
  log_->say("tessera: %s, %d layers, %d heads (%d key/value), n_embd %d, ffn %d, vocab %d "
            "(padded %d), %s head%s: %.2fM parameters",
            arch_name(shape_.arch), shape_.n_layer, shape_.n_head, shape_.n_kv_head, shape_.n_embd,
            shape_.ffn_hidden, shape_.vocab_size, shape_.padded_vocab,
            shape_.tied ? "tied" : "untied", shape_.qk_norm ? ", q/k norms" : "",
            tile_.canonical.total / 1e6);
  if (shape_.moe.experts > 0) {
    int routed = 0;
    for (int l = 0; l < shape_.n_layer; ++l) routed += shape_.moe.layer(l) ? 1 : 0;
    // A token's GEMMs read the active parameters: the router and top_k of the experts.
    log_->say("moe: %d of %d layers route each token to %d of %d experts of width %d; %.2fM "
              "parameters in GEMMs active per token",
              routed, shape_.n_layer, shape_.moe.top_k, shape_.moe.experts, shape_.moe.ffn,
              (active_matmul_params(shape_) + double(shape_.padded_vocab) * shape_.n_embd) / 1e6);
  }
  const int v = run_.virtual_stages, zero = cfg_.parallel.zero, group = layout.shard_size();
  std::string sharding;
  if (zero > 0)
    sharding = ", ZeRO-" + std::to_string(zero) +
               (group < layout.dpcp() ? " in groups of " + std::to_string(group) +
                                            (layout.cp > 1 ? " dp x cp ranks" : " dp ranks")
                                      : "");
  log_->say("layout: %s on %d ranks, %s schedule%s, %d micro-batches of %d per dp rank%s",
            layout_name(layout).c_str(), world_size_, deck_word(cfg_.parallel.schedule),
            v > 1 ? (" interleaved over " + std::to_string(v) + " virtual stages").c_str() : "",
            run_.n_micro, run_.micro_batch, sharding.c_str());
  if (zero >= 2 && group == 1)
    log_->say("note: parallel.zero = %d shards over %s of one rank: it has no effect but the "
              "unit-by-unit gradient buffers",
              zero, layout.dp == 1 ? "dp = 1" : "parallel.zero_group");
  if (world_size_ > 1) {
    std::vector<std::vector<std::pair<int, int>>> chunks(run_.stage_chunks.size());
    for (size_t s = 0; s < run_.stage_chunks.size(); ++s)
      for (const LayerRange& r : run_.stage_chunks[s]) chunks[s].emplace_back(r.begin, r.end);
    // What the first and last stages hold besides their layers, by the family's names.
    const ParamLayout& P = tile_.canonical;
    auto module = [&](int tensor) {
      const std::string& name = P.tensors[size_t(tensor)].name;
      return name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    };
    const std::string norm = module(P.norm_weight), token = module(P.embed);
    const std::string embed = P.positions >= 0 ? token + ", " + module(P.positions) : token;
    const std::string head = P.head >= 0 ? ", " + module(P.head) : "";  // untied
    const std::string last_only = shape_.tied ? token + " copy, " + norm : norm + head;
    const std::string both = embed + ", " + norm + head;
    log_->say("%s", rank_grid(mesh_->shape(), chunks, embed, last_only, both).c_str());
  }
  if (!backend_.note.empty()) log_->say("%s", backend_.note.c_str());
  const int rows = run_.micro_batch * T_;
  if (cfg_.parallel.sequence_parallel)
    log_->say(layout.tp > 1 ? "sequence parallel: norms and residuals on %d of every %d rows per rank"
                            : "warning: parallel.sequence_parallel has no effect with tp = 1 "
                              "(%d of %d rows per rank)",
              rows / layout.tp, rows);
  // What the rank holds: under ZeRO-2 its part of the gradients, under ZeRO-3 of the parameters
  // too (the buffers the engine keeps; the gathered units are the plan line's ZeRO transient).
  const TrainEngine::Footprint held = engine_->footprint();
  log_->say("memory (rank 0): parameters %s, gradients %s, optimizer state (%s) "
            "%.1f MB, activations %.1f MB (%s attention, recompute %s)",
            human_bytes(double(held.params)).c_str(), human_bytes(double(held.grads)).c_str(),
            engine_->optim_rule().c_str(),
            engine_->moment_bytes() / 1e6, engine_->activation_bytes() / 1e6,
            deck_word(cfg_.model.attention), deck_word(cfg_.train.recompute));
  if (shape_.moe.experts > 0) {
    // The experts' share of the parameters (their gradients and moments alike), and the
    // MoE layers' kept activations and dispatch buffers.
    const double expert = double(tile_.expert_elements());
    log_->say("memory (rank 0), mixture of experts: expert parameters %.1f MB of the %.1f MB "
              "(%d of %d experts a layer), dense %.1f MB; routing and dispatch buffers %.1f MB "
              "of the activations",
              4.0 * expert / 1e6, 4.0 * tile_.total / 1e6, shape_.moe.experts / layout.ep,
              shape_.moe.experts, 4.0 * (double(tile_.total) - expert) / 1e6,
              engine_->moe_buffer_bytes() / 1e6);
  }
  log_->say("plan (rank 0): %s", memory_line(planned_).c_str());
  if (const std::string report = engine_->memory_report(); !report.empty())
    log_->say("%s", report.c_str());
}

void Run::announce_data() {
  for (size_t s = 0; s < train_data_->sources().size(); ++s) {
    const TokenSource& src = train_data_->sources()[s];
    log_->say("data: %s: %s, %d-bit, %llu tokens in %zu file%s, %llu %swindows of %d, weight %.4g",
              src.spec().c_str(), format_name(src.format()), 8 * src.token_bytes(),
              (unsigned long long)src.num_tokens(), src.files().size(),
              src.files().size() == 1 ? "" : "s", (unsigned long long)src.num_windows(T_),
              cfg_.data.windows == Windows::Documents ? "document-start " : "", T_ + 1,
              train_data_->entries()[s].weight);
  }
  if (val_data_)
    log_->say("data: val %s: %s, %llu tokens", val_data_->spec().c_str(),
              format_name(val_data_->format()), (unsigned long long)val_data_->num_tokens());
  if (cfg_.data.check_tokens)
    log_->say("data: %llu token ids checked below vocab %d in %.2f s (largest %u)",
              (unsigned long long)checked_tokens_, vocab_, check_seconds_, max_id_);
  std::string job;
  for (const char* var : {"SLURM_JOB_ID", "SLURM_RESTART_COUNT", "PBS_JOBID", "PBS_RUN_COUNT"})
    if (const char* v = std::getenv(var)) job += std::string(job.empty() ? "" : " ") + var + "=" + v;
  if (!job.empty()) log_->say("job: %s", job.c_str());
  for (const std::string& note : dirs_->notes()) log_->say("%s", note.c_str());
}

// Where the parameters came from (restore() read or made them).
void Run::announce_start() {
  if (!restart_from_.empty()) {
    if (state_.seed != cfg_.train.seed)
      log_->say("restart: note: checkpoint seed %llu kept (deck says %llu)",
                (unsigned long long)state_.seed, (unsigned long long)cfg_.train.seed);
    log_->say("restart: %s at step %lld, saved on %s (read in %.2f s)", restart_from_.c_str(),
              (long long)state_.step, restored_layout_.c_str(), read_seconds_);
    log_->say("restart: data resumes at global sample %lld (%s)", (long long)state_.next_sample,
              train_data_->position(uint64_t(state_.next_sample)).c_str());
    if (!state_.data_sources.empty() && state_.data_sources != train_data_->describe())
      log_->say("restart: note: the training data changed since the checkpoint (it read: %s); "
                "the new data continues from global sample %lld",
                state_.data_sources.c_str(), (long long)state_.next_sample);
  } else if (!init_from_.empty()) {
    log_->say("init: weights from %s (step %lld of its run, saved_layout '%s'), fresh optimizer, "
              "step 0 (read in %.2f s)",
              init_from_.c_str(), (long long)init_info_.state.step,
              init_info_.saved_layout.c_str(), read_seconds_);
    if (init_info_.tokenizer.type != "none" && init_info_.tokenizer.type != tokenizer().type)
      log_->say("init: note: the weights come with tokenizer '%s', the training data has '%s'",
                init_info_.tokenizer.type.c_str(), tokenizer().type.c_str());
  } else {
    log_->say("init: fresh model from seed %llu (%.2f s)", (unsigned long long)cfg_.train.seed,
              init_seconds_);
  }
}

// The peak MFU is measured against: the deck's, a GPU's datasheet figure for its precision (0 on
// the CPU, or a GPU not in the table), else the CPU's sgemm measured now; one for the whole job.
void Run::measure_peak() {
  peak_gflops_ = cfg_.log.peak_gflops;
  const char* peak_from = "log.peak_gflops";
  if (peak_gflops_ <= 0) {
    const bool fp8 = cfg_.device.precision == Precision::Fp8;
    peak_gflops_ = engine_->peak_gflops(fp8);
    peak_from = fp8 ? "GPU datasheet, FP8" : "GPU datasheet";
    if (peak_gflops_ <= 0) {
      peak_gflops_ = measure_sgemm_gflops(0.5);
      peak_from = "sgemm measured now";
    }
    MPI_Bcast(&peak_gflops_, 1, MPI_DOUBLE, 0, world_comm_);
  }
  log_->say("peak: %.1f GFLOP/s per rank (%s) on %d threads", peak_gflops_, peak_from,
            omp_get_max_threads());
  flops_token_ = flops_per_token(shape_, T_);
}

void Run::log_step(double secs, double loss, double norm) {
  const double tok_s = double(B_) * T_ / secs;
  const double mfu = flops_token_ * tok_s / (peak_gflops_ * 1e9 * world_size_);
  if (state_.step % cfg_.log.every != 0 && state_.step != 1 && state_.step != cfg_.train.steps)
    return;
  // The loader's wait is rank 0's (a first-stage rank: it reads tokens) over the interval.
  const double wait_fraction = telemetry_.take_data_wait_fraction();
  const double per_step = seconds_since(t_loop_) / double(state_.step - first_step_);
  const MoeReport moe = moe_report();
  log_->say("step %6lld/%d | loss %.4f | lr %.3e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%% "
            "| data wait %.2f%%%s | %s elapsed, ETA %s",
            (long long)state_.step, cfg_.train.steps, loss, state_.lr, norm, secs * 1e3, tok_s,
            mfu * 100, wait_fraction * 100, moe.line.c_str(),
            clock_time(seconds_since(t_start_)).c_str(),
            clock_time(per_step * double(cfg_.train.steps - state_.step)).c_str());
  JsonRow row = {{"type", "train"},
                 {"step", state_.step},
                 {"tokens", state_.tokens_seen},
                 {"elapsed_s", printed("%.3f", seconds_since(t_start_))},
                 {"loss", loss},
                 {"lr", printed("%.9g", state_.lr)},
                 {"grad_norm", printed("%.9g", norm)},
                 {"ms", printed("%.3f", secs * 1e3)},
                 {"tokens_per_s", printed("%.1f", tok_s)},
                 {"mfu", printed("%.5f", mfu)},
                 {"pipeline_wait", printed("%.5f", engine_->counters().pipeline_wait / secs)},
                 {"data_wait", printed("%.6f", wait_fraction)}};
  row.update(moe.json);
  // Where the interval's steps went (rank 0's), ms a step.
  JsonRow breakdown;
  for (const auto& [name, ms] : telemetry_.take_interval_breakdown().ms_per_step())
    breakdown[name] = printed("%.4f", ms);
  if (!breakdown.empty()) row["breakdown_ms"] = breakdown;
  log_->json(row);
}

// The run's step breakdown after the first step (rank 0's): a table in the log, the largest first.
void Run::log_breakdown() {
  std::vector<std::pair<std::string, double>> rows = telemetry_.run_breakdown().ms_per_step();
  if (rows.empty()) return;
  const double step = rows.back().second;
  rows.pop_back();
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string table;
  for (const auto& [name, ms] : rows) {
    if (ms <= 0) continue;
    char line[96];
    std::snprintf(line, sizeof line, "\n  %-14s %10.2f ms %6.1f%%", name.c_str(), ms,
                  step > 0 ? 100 * ms / step : 0.0);
    table += line;
  }
  const char* untimed = "; ops not timed: log.breakdown false (or auto on a GPU)";
  log_->say("breakdown (rank 0, a step after the first, %ld steps%s): %.2f ms%s",
            telemetry_.run_breakdown().steps, op_clock::enabled() ? "" : untimed, step,
            table.c_str());
}

// The step's MoE routing (moe_stats_) for the step line and metrics.jsonl: the balancing losses
// per micro-batch (as the objective adds them), each MoE layer's busiest expert against the mean
// (1: balanced), the choices the capacity dropped.
Run::MoeReport Run::moe_report() const {
  MoeReport r;
  if (moe_stats_.empty()) return r;
  const double micro = double(run_.n_micro) * run_.layout.dp;
  const double aux = moe_stats_[0] / micro, z = moe_stats_[1] / micro;
  // The exchange per rank (the ranks counted once: dp x pp of them).
  const double ranks = double(run_.layout.dp) * run_.layout.pp;
  const double a2a_bytes = moe_stats_[2] / ranks, a2a_s = moe_stats_[3] / ranks;
  std::vector<double> loads;
  double worst = 0, dropped = 0;
  for (int l = 0; l < shape_.n_layer; ++l) {
    if (!shape_.moe.layer(l)) continue;
    const size_t at = 4 + 3 * size_t(l);
    const double ratio = moe_stats_[at + 1] > 0 ? moe_stats_[at] / moe_stats_[at + 1] : 0;
    worst = std::max(worst, ratio);
    dropped += moe_stats_[at + 2];
    loads.push_back(printed("%.5f", ratio));
  }
  char line[96];
  std::snprintf(line, sizeof line, " | moe aux %.4g load %.2f", aux + z, worst);
  r.line = line;
  if (dropped > 0) r.line += " dropped " + std::to_string(int64_t(dropped));
  if (run_.layout.ep > 1) {
    std::snprintf(line, sizeof line, " a2a %.2f MB %.1f ms", a2a_bytes / 1e6, a2a_s * 1e3);
    r.line += line;
  }
  r.json = {{"moe_aux", printed("%.9g", aux)},
            {"moe_z", printed("%.9g", z)},
            {"moe_load", loads},
            {"moe_dropped", int64_t(dropped)},
            {"moe_a2a_bytes", printed("%.0f", a2a_bytes)},
            {"moe_a2a_s", printed("%.6f", a2a_s)}};
  return r;
}

// One line per rank in metrics.jsonl: its memory, its bytes per step on each communicator
// (payload handed to MPI), and its pipeline bubble; 15 digits, so byte counts are exact.
void Run::log_ranks() {
  const TrainEngine::Footprint f = engine_->footprint();
  std::vector<std::pair<std::string, double>> stats = {
      {"dp_rank", mesh_->coord("dp")},
      {"tp_rank", mesh_->coord("tp")},
      {"pp_rank", mesh_->coord("pp")},
      {"cp_rank", mesh_->coord("cp")},
      {"param_bytes", 4.0 * tile_.total},
      {"grad_bytes", 4.0 * tile_.total},
      {"optim_bytes", double(engine_->moment_bytes())},
      {"activation_bytes", double(engine_->activation_bytes())},
      {"micro_batches", double(run_.n_micro)},
      {"param_buffer_bytes", double(f.params)},
      {"grad_buffer_bytes", double(f.grads)},
      {"optimizer_buffer_bytes", double(f.optimizer)},
      {"transient_bytes", double(f.transient)},
      {"arena_bytes", double(f.arena)},
      {"pipeline_buffer_bytes", double(f.pipeline)}};
  // Each group's payload per step, by the names the planner's table uses (parallel/traffic.hpp),
  // the bubble and the waits.
  for (const auto& stat : telemetry_.per_step()) stats.push_back(stat);
  const int kStats = int(stats.size());
  std::vector<double> mine, all(size_t(kStats) * world_size_);
  for (const auto& [name, value] : stats) mine.push_back(value);
  MPI_Gather(mine.data(), kStats, MPI_DOUBLE, all.data(), kStats, MPI_DOUBLE, 0, world_comm_);
  for (int r = 0; r < world_size_; ++r) {
    JsonRow row = {{"type", "rank"}, {"rank", r}};
    for (int k = 0; k < kStats; ++k) {
      // Counts and byte sizes as integers, the rest (seconds, fractions) to 15 digits.
      const double v = all[size_t(r) * kStats + k];
      auto& cell = row[stats[size_t(k)].first];
      if (v == std::floor(v) && std::fabs(v) < 0x1p53) cell = int64_t(v);
      else cell = printed("%.15g", v);
    }
    log_->json(row);
  }
}

}  // namespace tessera
