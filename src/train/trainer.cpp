#include "train/trainer.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "backend/peak.hpp"
#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/token_file.hpp"
#include "model/gpt.hpp"
#include "model/init.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "train/batch.hpp"
#include "train/evaluate.hpp"

namespace tessera {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Console and metrics.jsonl, rank 0 only.
class RunLog {
 public:
  RunLog(bool active, const std::string& run_dir) : active_(active) {
    if (!active_) return;
    metrics_.open(fs::path(run_dir) / "metrics.jsonl", std::ios::app);
    if (!metrics_) throw UserError("cannot write " + run_dir + "/metrics.jsonl", kExitIO);
  }
  template <typename... Args>
  void say(const char* fmt, Args... args) {
    if (!active_) return;
    std::printf(fmt, args...);
    std::printf("\n");
    std::fflush(stdout);
  }
  void json(const std::string& line) {
    if (!active_) return;
    metrics_ << line << '\n';
    metrics_.flush();
  }

 private:
  bool active_;
  std::ofstream metrics_;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

int train(MPI_Comm world, const Config& cfg) {
  int rank = 0, world_size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &world_size);
  if (world_size != 1)
    throw UserError("this tessera trains on one rank; run it with mpiexec -n 1 (got " +
                    std::to_string(world_size) + " ranks)");
  if (cfg.device.backend == "cuda")
    throw UserError(cfg.deck_path + ": device.backend = cuda, but this tessera was built without "
                    "the CUDA backend; use device.backend: cpu");
  if (cfg.device.threads > 0) omp_set_num_threads(cfg.device.threads);
  const auto t_start = Clock::now();

  // --- data and model shape ---
  TokenFile train_data(cfg.data.train);
  std::unique_ptr<TokenFile> val_data;
  if (!cfg.data.val.empty()) val_data = std::make_unique<TokenFile>(cfg.data.val);
  const int data_vocab = int(train_data.tokenizer().vocab_size);
  const int vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : data_vocab;
  if (data_vocab > vocab)
    throw UserError(cfg.data.train + ": tokenizer vocab_size " + std::to_string(data_vocab) +
                    " exceeds model.vocab_size " + std::to_string(vocab));
  const int T = cfg.data.seq_len;
  const int B = cfg.train.batch_size;
  const int mb = cfg.train.micro_batch > 0 ? cfg.train.micro_batch : B;
  const int n_micro = B / mb;
  if (train_data.num_windows(T) == 0)
    throw UserError(cfg.data.train + ": " + std::to_string(train_data.num_tokens()) +
                    " tokens hold no window of data.seq_len + 1 = " + std::to_string(T + 1));

  const ModelShape shape =
      make_model_shape(cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd,
                       cfg.model.block_size, vocab, cfg.model.vocab_multiple);
  const ParamLayout layout = make_param_layout(shape);
  std::vector<float> params(layout.total), grads(layout.total), m(layout.total), v(layout.total);
  Gpt model(layout, mb, T);

  const std::string ckpt_dir =
      cfg.checkpoint.dir.empty() ? (fs::path(cfg.run.dir) / "checkpoints").string()
                                 : cfg.checkpoint.dir;
  // --- start: fresh or from a checkpoint ---
  TrainState state;
  state.seed = cfg.train.seed;
  std::string restart_from;
  if (cfg.checkpoint.restart == "auto") {
    restart_from = resolve_checkpoint(ckpt_dir);
  } else if (cfg.checkpoint.restart != "none") {
    restart_from = resolve_checkpoint(cfg.checkpoint.restart);
    if (restart_from.empty())
      throw UserError(cfg.deck_path + ": checkpoint.restart = " + cfg.checkpoint.restart +
                          ": no such checkpoint file or directory with one",
                      kExitIO);
  }
  const ModelBuffers buffers{params.data(), m.data(), v.data()};
  // A bad checkpoint is refused before anything is printed.
  CheckpointInfo restored;
  const auto t_read = Clock::now();
  if (!restart_from.empty()) {
    restored = read_checkpoint(world, restart_from, layout, buffers);
    state = restored.state;
  }
  const double read_seconds = seconds_since(t_read);

  std::error_code ec;
  if (rank == 0) fs::create_directories(cfg.run.dir, ec);
  if (ec) throw UserError("cannot create run directory " + cfg.run.dir + ": " + ec.message(), kExitIO);
  RunLog log(rank == 0, cfg.run.dir);
  const std::string deck_yaml = to_yaml(cfg);
  if (rank == 0) std::ofstream(fs::path(cfg.run.dir) / "deck.yaml") << deck_yaml;

  log.say("tessera: %d layers, %d heads, n_embd %d, vocab %d (padded %d): %.2fM parameters",
          shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, shape.padded_vocab,
          layout.total / 1e6);
  log.say("memory: parameters, gradients, Adam moments %.1f MB; activations %.1f MB",
          4.0 * layout.total * 4 / 1e6, model.activation_bytes() / 1e6);
  log.say("data: %s: %llu tokens, %llu windows of %d; batch %d = %d x %d micro-batches",
          cfg.data.train.c_str(), (unsigned long long)train_data.num_tokens(),
          (unsigned long long)train_data.num_windows(T), T + 1, B, n_micro, mb);

  if (!restart_from.empty()) {
    if (state.seed != cfg.train.seed)
      log.say("restart: note: checkpoint seed %llu kept (deck says %llu)",
              (unsigned long long)state.seed, (unsigned long long)cfg.train.seed);
    log.say("restart: %s at step %lld (read in %.2f s)", restart_from.c_str(),
            (long long)state.step, read_seconds);
  } else {
    const auto t0 = Clock::now();
    init_parameters(params.data(), layout, cfg.train.seed, cfg.model.init_std);
    log.say("init: fresh model from seed %llu (%.2f s)", (unsigned long long)cfg.train.seed,
            seconds_since(t0));
  }

  const double peak_gflops =
      cfg.log.peak_gflops > 0 ? cfg.log.peak_gflops : measure_sgemm_gflops(0.5);
  log.say("peak: %.1f GFLOP/s (%s) on %d threads", peak_gflops,
          cfg.log.peak_gflops > 0 ? "log.peak_gflops" : "sgemm measured now",
          omp_get_max_threads());
  const double flops_token = flops_per_token(shape, T);

  LrSchedule schedule{cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps,
                      cfg.optim.decay_steps > 0 ? cfg.optim.decay_steps : cfg.train.steps};
  const AdamWHyper hyper{cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay};
  const TokenizerInfo& tokenizer = train_data.tokenizer();

  auto save = [&] {
    const auto t0 = Clock::now();
    const std::string path =
        write_checkpoint(world, ckpt_dir, layout, buffers, state, deck_yaml, tokenizer);
    log.say("checkpoint: wrote %s (%.1f MB) in %.2f s", path.c_str(),
            fs::file_size(path, ec) / 1e6, seconds_since(t0));
  };
  auto evaluate = [&] {
    if (!val_data) return;
    const auto t0 = Clock::now();
    const double loss =
        evaluate_loss(model, params.data(), *val_data, mb, T, cfg.eval.batches);
    log.say("eval: step %lld val_loss %.4f (%.2f s)", (long long)state.step, loss,
            seconds_since(t0));
    log.json("{\"type\":\"eval\",\"step\":" + std::to_string(state.step) +
             ",\"val_loss\":" + fmt("%.9g", loss) + "}");
  };

  if (restart_from.empty() && cfg.train.steps == 0) save();  // the initial model, for references
  if (state.step == 0 && cfg.train.steps > 0) evaluate();

  Batch batch(mb, T);
  long last_saved = restart_from.empty() ? -1 : state.step;
  while (state.step < cfg.train.steps) {
    const auto t0 = Clock::now();
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    // Every micro-batch's gradient is scaled so that the sum is that of the mean over B*T tokens.
    const float dloss = 1.0f / float(size_t(B) * T);
    for (int k = 0; k < n_micro; ++k) {
      read_train_batch(train_data, uint64_t(state.next_sample) + uint64_t(k) * mb, state.seed,
                       vocab, batch);
      loss += model.forward(params.data(), batch.inputs.data(), batch.targets.data(), mb, T) /
              n_micro;
      model.backward(params.data(), grads.data(), batch.inputs.data(), mb, T, dloss);
    }
    const double norm = std::sqrt(sum_of_squares(grads.data(), grads.size()));
    if (cfg.optim.grad_clip > 0) clip_gradients(grads.data(), grads.size(), norm, cfg.optim.grad_clip);
    state.lr = schedule.at(state.step);
    adamw_step(params.data(), grads.data(), m.data(), v.data(), layout, hyper, state.lr,
               state.step + 1);
    state.step += 1;
    state.next_sample += B;
    state.tokens_seen += int64_t(B) * T;

    const double secs = seconds_since(t0);
    const double tok_s = double(B) * T / secs;
    const double mfu = flops_token * tok_s / (peak_gflops * 1e9);
    if (state.step % cfg.log.every == 0 || state.step == 1 || state.step == cfg.train.steps) {
      log.say("step %6lld/%d | loss %.4f | lr %.3e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%%",
              (long long)state.step, cfg.train.steps, loss, state.lr, norm, secs * 1e3, tok_s,
              mfu * 100);
      log.json("{\"type\":\"train\",\"step\":" + std::to_string(state.step) +
               ",\"loss\":" + fmt("%.17g", loss) + ",\"lr\":" + fmt("%.9g", state.lr) +
               ",\"grad_norm\":" + fmt("%.9g", norm) + ",\"ms\":" + fmt("%.3f", secs * 1e3) +
               ",\"tokens_per_s\":" + fmt("%.1f", tok_s) + ",\"mfu\":" + fmt("%.5f", mfu) + "}");
    }
    const bool last = state.step == cfg.train.steps;
    if (cfg.eval.every > 0 && state.step % cfg.eval.every == 0 && !last) evaluate();
    if ((cfg.checkpoint.every > 0 && state.step % cfg.checkpoint.every == 0) || last) {
      save();
      last_saved = state.step;
    }
    if (last) evaluate();
  }
  if (last_saved != state.step && cfg.train.steps > 0) save();
  log.say("done: %lld steps, %.1f s", (long long)state.step, seconds_since(t_start));
  return 0;
}

}  // namespace tessera
