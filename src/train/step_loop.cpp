// The step loop of a run (train/run.hpp): at each step boundary the ranks agree on failed writes
// and stop requests; each step reads its micro-batches from the loader, runs the engine's
// forward, backward and update, judges the result by the anomaly policy (train.anomaly_*) and
// logs it; evaluations and checkpoints come at their cadence. finish() closes the run.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/error.hpp"
#include "io/eval_data.hpp"
#include "io/tokenizer.hpp"
#include "train/heartbeat.hpp"
#include "train/run.hpp"

namespace tessera {

// The step 0 checkpoint or evaluation, then what the loop needs: the loader reading ahead, the
// data trace, the hang watchdog.
void Run::start_loop() {
  start_background_writer();
  // A stop signal before the first step still ends the job at once, with no checkpoint: none
  // before the step-0 evaluation or the initial model's checkpoint, none after it.
  stop_point("the start-up log");
  if (restart_from_.empty() && cfg_.train.steps == 0) save();  // the initial model, for references
  if (state_.step == 0 && cfg_.train.steps > 0) {
    evaluate();
    stop_point("the step-0 evaluation");
  }
  last_saved_ = restart_from_.empty() ? -1 : state_.step;
  const int n_micro = run_.n_micro, mb = run_.micro_batch;
  views_.resize(size_t(n_micro));
  // This dp rank's share of each global batch: samples [first, first + n_micro * mb) of the
  // step, read ahead by the loader thread.
  const uint64_t first = uint64_t(state_.next_sample) + uint64_t(mesh_->coord("dp")) * n_micro * mb;
  if (reads_tokens_)
    loader_ = std::make_unique<Prefetcher>(
        *train_data_, vocab_, first, uint64_t(B_),
        n_micro * mb, cfg_.data.prefetch, cfg_.data.readers, cfg_.data.direct_io,
        engine_->loader_memory());
  if (cfg_.data.trace && reads_tokens_ && tile_.first && mesh_->coord("tp") == 0)
    trace_failure_ = trace_.open((std::filesystem::path(cfg_.run.dir) /
                                  ("data_trace.rank" + std::to_string(world_rank_) + ".txt"))
                                     .string());
  // The ETA: the wall time per step of this job so far (evaluations and checkpoints included).
  t_loop_ = Clock::now();
  first_step_ = state_.step;
  // Every micro-batch's gradient is scaled so that the sum over the job is that of the mean
  // over the global batch's B*T positions.
  dloss_ = 1.0f / float(size_t(B_) * T_);
  // Hang forensics (run.hang_timeout): the watchdog runs while the steps do.
  if (cfg_.run.hang_timeout > 0) {
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      log_->say("%s", "warning: the MPI library gives no MPI_THREAD_MULTIPLE: the hang watchdog "
                      "calls MPI_Abort from its own thread all the same");
    watchdog_ = std::make_unique<Watchdog>(cfg_.run.dir, world_rank_, world_size_,
                                           cfg_.run.hang_timeout);
  }
}

std::optional<int> Run::loop() {
  start_loop();
  while (state_.step < cfg_.train.steps) {
    trace::set_phase("step boundary");
    if (const int stop = step_boundary(); stop != kNone) {
      if (last_saved_ != state_.step) save();
      finish_write();  // a stop ends with a complete checkpoint
      const int status = stop_status(stop);
      log_->say("stop: %s at step %lld: checkpoint written, exit %d%s", stop_why(stop),
                (long long)state_.step, status,
                status == kExitRequeue ? " (requeue to continue)" : "");
      return write_exit_status(status);
    }
    trace::set_step(state_.step + 1);
    trace::set_phase("training step");
    if (faults_.stalls(world_rank_, state_.step + 1)) {
      trace::set_phase("stalled on purpose (TESSERA_TEST_STALL)");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const auto t0 = Clock::now();
    read_step();
    double loss = 0, norm = 0;
    std::string anomaly;
    take_step(&loss, &norm, &anomaly);
    if (!anomaly.empty()) {
      if (std::optional<int> status = meet_anomaly(anomaly, loss, norm)) return status;
      continue;
    }
    anomaly_.accept(loss, norm);
    state_.step += 1;
    state_.next_sample += B_;
    state_.tokens_seen += int64_t(B_) * T_;

    const double secs = seconds_since(t0);
    last_step_seconds_ = secs;
    if (watchdog_ && !hang_warned_ && secs > cfg_.run.hang_timeout) {
      log_->say("warning: step %lld took %.1f s, longer than run.hang_timeout = %g s: the "
                "watchdog may end a healthy run", (long long)state_.step + 1, secs,
                cfg_.run.hang_timeout);
      hang_warned_ = true;
    }
    telemetry_.add_step_seconds(secs);
    log_step(secs, loss, norm);
    after_step();
  }
  return std::nullopt;
}

// At each step boundary the ranks agree on two things: a write that failed on any rank
// (metrics.jsonl, the data trace) ends the run on all of them; and a stop request, a signal any
// rank received or (rank 0's clock) a wall-time budget the next step and its checkpoint would
// overrun. The larger request wins.
int Run::step_boundary() {
  if (std::string why = agree_on_failure(world_comm_, world_rank_ == 0 && !log_->failure().empty()
                                                          ? log_->failure()
                                                          : trace_failure_);
      !why.empty())
    throw UserError(why, kExitIO);
  int code = signalled_stop();
  if (code == kNone && world_rank_ == 0 && cfg_.run.max_minutes > 0 &&
      seconds_since(t_start_) + last_step_seconds_ + last_save_seconds_ > cfg_.run.max_minutes * 60)
    code = kBudget;
  world_->all_reduce_max(&code, 1);
  return code;
}

// The step's micro-batches from the loader (stages that read no tokens have none), and their
// token ids in the data trace.
void Run::read_step() {
  if (!loader_) return;
  const StepSamples& samples = loader_->next();
  telemetry_.add_data_wait(loader_->take_wait_seconds());
  if (!loader_logged_) log_->say("loader: %s", loader_->mode().c_str());
  loader_logged_ = true;
  const size_t rows = size_t(run_.micro_batch) * T_;
  for (size_t k = 0; k < views_.size(); ++k)
    views_[k] = {samples.inputs + k * rows, samples.targets + k * rows};
  if (!trace_.is_open() || !trace_failure_.empty()) return;
  std::string lines;
  for (size_t i = 0; i < samples.refs.size(); ++i) {
    lines += std::to_string(state_.step + 1) + ' ' + std::to_string(samples.first + i) + ' ' +
             std::to_string(samples.refs[i].source) + ' ' +
             std::to_string(samples.refs[i].window) + ':';
    for (int t = 0; t < T_; ++t)
      lines += ' ' + std::to_string(samples.inputs[i * size_t(T_) + size_t(t)]);
    lines += ' ' + std::to_string(samples.targets[i * size_t(T_) + size_t(T_ - 1)]) + '\n';
  }
  trace_failure_ = trace_.append(lines);
}

// Forward and backward through the pipeline, the gradient sums, the norm, clipping and AdamW, on
// the engine's backend (engine/engine.hpp). The anomaly policy judges the loss and the norm
// before the update: every rank the same reduced numbers, and a MAX to be sure.
void Run::take_step(double* loss, double* norm, std::string* anomaly) {
  telemetry_.before_step(*engine_);
  state_.lr = schedule_lr_.at(state_.step);
  const float step_dloss = faults_.step_dloss(state_.step + 1, dloss_);
  auto check = [&](double stage_loss, double step_norm, double fp8_amax) {
    *loss = speaks_loss_ ? stage_loss : 0;
    world_->all_reduce_sum(loss, 1);
    *loss /= double(run_.n_micro) * run_.layout.dpcp();  // each cp rank: its chunks' mean
    *anomaly = anomaly_.judge(*loss, step_norm, fp8_amax);
    int bad = !anomaly->empty();
    world_->all_reduce_max(&bad, 1);
    if (bad && anomaly->empty()) *anomaly = "another rank judged it anomalous";
    return bad == 0;
  };
  const TrainEngine::StepResult result = engine_->train_step(
      views_, step_dloss, cfg_.optim.grad_clip, state_.lr, state_.step + 1, check);
  *norm = result.norm;
  if (shape_.moe.experts > 0) {
    // tp and cp ranks route the same tokens (cp's sums are the micro-batch's already): one copy.
    moe_stats_ = engine_->take_moe_stats(shape_.n_layer);
    if (mesh_->coord("tp") != 0 || mesh_->coord("cp") != 0)
      std::fill(moe_stats_.begin(), moe_stats_.end(), 0.0);
    world_->all_reduce_sum(moe_stats_.data(), moe_stats_.size());
  }
  // Where the FP8 GEMMs ran, after the first step; with experts after the second too, the first
  // whose experts' GEMMs are on codes (a run's first records their amaxes: docs/fp8.md).
  const long measured = telemetry_.measured_steps();
  if (measured == 0 || (shape_.moe.experts > 0 && measured == 1))
    if (const std::string report = engine_->fp8_report(); !report.empty())
      log_->say("%s", report.c_str());
  telemetry_.after_step(*engine_);
}

// The update was dropped on every rank; the batch is consumed whatever the action. Returns the
// exit status when the policy stops the run.
std::optional<int> Run::meet_anomaly(const std::string& anomaly, double loss, double norm) {
  const int64_t attempted = state_.step + 1, from = state_.next_sample;
  state_.next_sample += B_;
  AnomalyPolicy::Outcome outcome =
      anomaly_.meet(from, state_.next_sample, ckpt_dir_, [this] { return rollback(); });
  const int status = outcome.status;
  if (status != 0)
    outcome.text +=
        ": no checkpoint written, " + kept_checkpoint() + ", exit " + std::to_string(status);
  log_->say("anomaly: step %lld: %s (loss %.4f, grad_norm %.4g): %s", (long long)attempted,
            anomaly.c_str(), loss, norm, outcome.text.c_str());
  // A stop is an error: its line goes to stderr too, as every other error's does.
  if (status != 0 && world_rank_ == 0)
    std::fprintf(stderr, "anomaly: step %lld: %s (loss %.4f, grad_norm %.4g): %s\n",
                 (long long)attempted, anomaly.c_str(), loss, norm, outcome.text.c_str());
  log_->json({{"type", "anomaly"},
              {"step", attempted},
              {"loss", loss},
              {"grad_norm", printed("%.9g", norm)},
              {"reason", anomaly},
              {"action", outcome.action},
              {"rollbacks", anomaly_.rollbacks()},
              {"skipped_samples", anomaly_.skipped_samples()}});
  if (status == 0) return std::nullopt;
  finish_write();
  return write_exit_status(status);
}

// The cadence: an evaluation every eval.every steps, a checkpoint every checkpoint.every and at
// the last step (then its evaluation).
void Run::after_step() {
  const bool last = state_.step == cfg_.train.steps;
  if (cfg_.eval.every > 0 && state_.step % cfg_.eval.every == 0 && !last) evaluate();
  if ((cfg_.checkpoint.every > 0 && state_.step % cfg_.checkpoint.every == 0) || last) {
    const auto t_save = Clock::now();
    save();
    last_saved_ = state_.step;
    // The budget keeps room for a whole write: the stop waits for it.
    last_save_seconds_ = background_ ? std::max(seconds_since(t_save), last_write_seconds_)
                                     : seconds_since(t_save);
  }
  if (last) evaluate();
}

void Run::evaluate() {
  if (!val_data_) return;
  trace::set_phase("evaluation");
  const auto t0 = Clock::now();
  const Heartbeat beat(world_rank_ == 0, "eval: step " + std::to_string(state_.step) + " on " +
                                             cfg_.data.val);
  // Every layout evaluates the same windows: dp rank d takes the d-th share of them.
  const uint64_t total = eval_windows(*val_data_, T_, B_, cfg_.eval.batches);
  const uint64_t share = total / uint64_t(run_.layout.dp);
  const uint64_t first = share * uint64_t(mesh_->coord("dp"));
  double sum = engine_->eval_loss_sum(*val_data_, vocab_, first, share);
  if (!speaks_loss_) sum = 0;
  world_->all_reduce_sum(&sum, 1);
  const double loss = sum / (double(total / uint64_t(run_.micro_batch)) * run_.layout.cp);
  // Bits per byte: the windows' summed loss over the bytes of text their targets spell, so runs
  // with different tokenizers compare.
  const double bytes = val_bytes(total);
  const double bpb = bytes > 0 ? loss * double(total) * T_ / (bytes * std::log(2.0)) : -1;
  const std::string bpb_text = bpb >= 0 ? " val_bpb " + fmt("%.4f", bpb) : "";
  log_->say("eval: step %lld val_loss %.4f%s (%.2f s)", (long long)state_.step, loss,
            bpb_text.c_str(), seconds_since(t0));
  JsonRow row = {{"type", "eval"},
                 {"step", state_.step},
                 {"tokens", state_.tokens_seen},
                 {"val_loss", printed("%.9g", loss)}};
  if (bpb >= 0) row["val_bpb"] = printed("%.9g", bpb);
  log_->json(row);
}

// The bytes of text of the targets of validation windows 0 .. windows-1 (tokens 1 .. windows*T
// of data.val: windows of T+1 at stride T), from the byte length of each id under the file's
// tokenizer; computed once. -1 when the file's tokenizer cannot decode (none, or gpt2 of an
// llm.c shard).
double Run::val_bytes(uint64_t windows) {
  if (val_bytes_windows_ == windows) return val_bytes_;
  val_bytes_windows_ = windows;
  const TokenizerInfo& info = val_data_->tokenizer();
  if (info.type != "byte" && !tokenizer_known(info)) return val_bytes_ = -1;
  const std::vector<uint32_t> lengths = Tokenizer(info, cfg_.data.val).token_byte_lengths();
  const uint64_t count = windows * uint64_t(T_);
  std::vector<uint32_t> ids(size_t(std::min<uint64_t>(count, 1 << 20)));
  double bytes = 0;
  for (uint64_t at = 0; at < count; at += ids.size()) {
    const uint64_t n = std::min<uint64_t>(ids.size(), count - at);
    val_data_->read(1 + at, n, ids.data());
    for (uint64_t i = 0; i < n; ++i) bytes += ids[i] < lengths.size() ? lengths[ids[i]] : 0;
  }
  return val_bytes_ = bytes;
}

int Run::finish() {
  if (last_saved_ != state_.step && cfg_.train.steps > 0) save();
  finish_write();
  watchdog_.reset();
  log_ranks();
  log_breakdown();
  log_->say("done: %lld steps, %.1f s", (long long)state_.step, seconds_since(t_start_));
  return write_exit_status(0);
}

}  // namespace tessera
