#include "train/trainer.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backend/peak.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "plan/layout.hpp"
#include "plan/memory.hpp"
#include "device/select.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/prefetch.hpp"
#include "model/shard.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/comm.hpp"
#include "parallel/topology.hpp"
#include "pipeline/schedule.hpp"
#include "train/anomaly.hpp"
#include "train/async_writer.hpp"
#include "train/engine.hpp"
#include "train/evaluate.hpp"
#include "train/heartbeat.hpp"
#include "train/run_dir.hpp"
#include "train/watchdog.hpp"
#include "train/signals.hpp"

namespace tessera {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Console and metrics.jsonl, world rank 0 only. A write of metrics.jsonl that fails (a full
// disk) is kept as failure() until the ranks next agree on failures, so that all stop together.
class RunLog {
 public:
  RunLog(bool active, const std::string& run_dir) : active_(active) {
    if (active_) failure_ = metrics_.open((fs::path(run_dir) / "metrics.jsonl").string());
  }
  template <typename... Args>
  void say(const char* fmt, Args... args) {
    if (!active_) return;
    std::printf(fmt, args...);
    std::printf("\n");
    std::fflush(stdout);
  }
  void json(const std::string& line) {
    if (active_ && failure_.empty()) failure_ = metrics_.append(line + "\n");
  }
  const std::string& failure() const { return failure_; }

 private:
  bool active_;
  AppendFile metrics_;
  std::string failure_;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "m:ss", or "h:mm:ss" from an hour on.
std::string clock_time(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// A number in metrics.jsonl: JSON has no NaN or infinity, so a loss that blew up is null.
std::string json_number(const char* f, double v) { return std::isfinite(v) ? fmt(f, v) : "null"; }

// Why a run stops before train.steps, agreed by all ranks (the larger wins).
enum Stop { kNone, kBudget, kSigint, kSigterm, kSigusr1 };
const char* const kStopWhy[] = {"", "wall-time budget run.max_minutes reached", "SIGINT",
                                "SIGTERM", "SIGUSR1"};

int signalled_stop() {
  switch (stop_signal()) {
    case SIGUSR1: return kSigusr1;
    case SIGTERM: return kSigterm;
    case SIGINT: return kSigint;
  }
  return kNone;
}

int stop_status(int stop) { return stop == kSigint ? kExitInterrupted : kExitRequeue; }

// The host memory this rank will take (the engine's buffers, the loader's ring, the copies of the
// Adam moments a checkpoint is written from), summed over the ranks of its node, against what
// the node has. Collective over world; the same UserError (exit 2) on every rank.
void check_node_memory(MPI_Comm world, uint64_t engine, uint64_t loader, uint64_t moments) {
  MPI_Comm node = device::node_comm(world);
  uint64_t need[3] = {engine, loader, moments};
  MPI_Allreduce(MPI_IN_PLACE, need, 3, MPI_UINT64_T, MPI_SUM, node);
  int ranks = 1, node_rank = 0;
  MPI_Comm_size(node, &ranks);
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  std::string source, failure;
  const uint64_t total = need[0] + need[1] + need[2];
  if (node_rank == 0) {
    const uint64_t available = available_host_memory(&source);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    if (total > available)
      failure = "the run needs " + human_bytes(double(total)) + " of host memory on " + host +
                " (" + std::to_string(ranks) + " rank" + (ranks > 1 ? "s" : "") +
                ": model buffers " + human_bytes(double(need[0])) + ", data loader " +
                human_bytes(double(need[1])) + ", checkpoint copies " +
                human_bytes(double(need[2])) + "), but " + human_bytes(double(available)) +
                " is available (" + source + "): a smaller model or micro-batch, or more nodes";
  }
  if (failure = agree_on_failure(world, failure); !failure.empty()) throw UserError(failure);
}

std::string layout_name(const ParallelLayout& l) {
  return "dp=" + std::to_string(l.dp) + ",tp=" + std::to_string(l.tp) +
         ",pp=" + std::to_string(l.pp);
}

}  // namespace

int train(MPI_Comm world_comm, const Config& cfg) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(world_comm, &world_rank);
  MPI_Comm_size(world_comm, &world_size);
  const device::DeviceChoice backend = device::choose_backend(cfg, world_comm);  // may refuse
  device::activate(backend);  // CUDA: this rank's GPU, stream and cuBLAS handle
  if (cfg.device.threads > 0) omp_set_num_threads(cfg.device.threads);
  const auto t_start = Clock::now();

  // --- data, model shape and layout: everything checked before anything is allocated ---
  const int T = cfg.data.seq_len;
  const int B = cfg.train.batch_size;
  Dataset train_data(cfg.data.train, cfg.data.format, cfg.data.dtype, T, cfg.train.seed);
  std::unique_ptr<TokenSource> val_data;
  if (!cfg.data.val.empty())
    val_data = std::make_unique<TokenSource>(cfg.data.val, cfg.data.format, cfg.data.dtype);
  const TokenizerInfo& tokenizer = train_data.sources().front().tokenizer();
  const int data_vocab = int(tokenizer.vocab_size);
  if (data_vocab == 0 && cfg.model.vocab_size == 0)
    throw UserError(cfg.data.train + ": " + format_name(train_data.sources().front().format()) +
                    " data does not record its vocabulary size; set model.vocab_size");
  const int vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : data_vocab;
  // An HDF5 token file records its tokenizer; an llm.c header only implies GPT-2's (or LLaMA-3's)
  // vocabulary, so there the deck may set a smaller one and the token check below decides.
  if (data_vocab > vocab && train_data.sources().front().format() == TokenFormat::hdf5)
    throw UserError(cfg.data.train + ": tokenizer vocab_size " + std::to_string(data_vocab) +
                    " exceeds model.vocab_size " + std::to_string(vocab));
  if (val_data && val_data->tokenizer().vocab_size != tokenizer.vocab_size)
    throw UserError(cfg.data.val + ": tokenizer vocab_size " +
                    std::to_string(val_data->tokenizer().vocab_size) + " differs from data.train's " +
                    std::to_string(data_vocab));
  const ModelShape shape = make_model_shape(cfg.model, vocab);

  ParallelLayout layout;
  if (std::string e = resolve_layout(cfg.parallel, world_size, &layout); !e.empty())
    throw UserError(cfg.deck_path + ": " + e);
  // The checks a layout must pass against the deck, each stage's chunks (plan/layout.hpp).
  RunLayout run;
  if (std::string e = make_run_layout(cfg, shape, layout, &run); !e.empty())
    throw UserError(cfg.deck_path + ": " + e);
  const int mb = run.micro_batch, n_micro = run.n_micro, v = run.virtual_stages;
  const std::vector<std::vector<LayerRange>>& stage_chunks = run.stage_chunks;

  Topology topo(world_comm, layout);
  const RankCoord me = topo.coord();
  Comm world(world_comm);
  // Each stage's layer chunks: virtual stage k = chunk * pp + stage holds the k-th of pp * v
  // equal ranges (v = 1: the stage's balanced or given range).
  const LocalLayout tile = rank_tile(run, shape, me.tp_rank, me.pp_rank);
  const std::vector<Action> schedule = rank_schedule(cfg, run, me.pp_rank);

  const std::string ckpt_dir =
      cfg.checkpoint.dir.empty() ? (fs::path(cfg.run.dir) / "checkpoints").string()
                                 : cfg.checkpoint.dir;
  // The checkpoint to start from, and whether its model has the deck's shape: an attribute read,
  // so that a wrong checkpoint is refused before anything is written.
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
  // checkpoint.init_from: a new run (step 0, fresh AdamW, this deck's seed and data order) from the
  // weights of another run or of tools/import_weights.py. A checkpoint of this run comes first,
  // so a requeued fine-tuning job continues where it stopped.
  std::string init_from;
  if (restart_from.empty() && !cfg.checkpoint.init_from.empty()) {
    init_from = resolve_checkpoint(cfg.checkpoint.init_from);
    if (init_from.empty())
      throw UserError(cfg.deck_path + ": checkpoint.init_from = " + cfg.checkpoint.init_from +
                          ": no such checkpoint file or directory with one",
                      kExitIO);
  }
  if (!restart_from.empty()) {
    const CheckpointInfo info = read_checkpoint_info(restart_from);
    check_checkpoint_shape(info, tile);
    require_optimizer_state(info);
  }
  if (!init_from.empty()) check_checkpoint_shape(read_checkpoint_info(init_from), tile);

  // The model, pipeline executor and optimizer of the chosen backend (train/engine.hpp): every
  // buffer declared now, checked against the memory of the node, allocated once below.
  const AdamWHyper hyper{cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay};
  const EngineSetup setup{tile, topo.comm(CommName::tp), topo.comm(CommName::dp),
                          topo.comm(CommName::pp), topo.comm(CommName::embed), &world, schedule,
                          mb, T, n_micro, /*zero=*/cfg.parallel.zero == 1,
                          /*embed_sum=*/layout.pp > 1 && shape.tied, hyper,
                          model_options(cfg)};
  const std::unique_ptr<TrainEngine> engine =
      make_engine(setup, backend.cuda, cfg.device.precision == "bf16", /*allocate=*/false);
  // The plan's count of this rank (plan/memory.hpp: the same declarations, made without
  // allocating): the engine's buffers, the loader's ring, and the Adam moments copied out for a
  // checkpoint (or in from one), checked against the memory of the node before any allocation.
  const RankMemory planned = rank_memory(cfg, shape, run, me.dp_rank, me.tp_rank, me.pp_rank,
                                         backend.cuda, cfg.device.precision == "bf16");
  if (planned.engine_host != engine->host_bytes() ||
      planned.activations != engine->activation_bytes())
    throw std::logic_error("tessera plan's count of this rank differs from its engine's");
  check_node_memory(world_comm, planned.engine_host, planned.loader, planned.checkpoint);
  const bool reads_tokens = tile.first || tile.last;

  // --- the output places: locked, writable, with room for a checkpoint; then the deck ---
  const std::string deck_yaml = to_yaml(cfg);
  const RunDirs dirs(world_comm, cfg.run.dir, ckpt_dir,
                     checkpoint_bytes(tile, tokenizer, deck_yaml.size() + 4096));
  RunLog log(world_rank == 0, cfg.run.dir);
  std::string failure = log.failure();
  if (world_rank == 0 && failure.empty())
    failure = write_file_atomically((fs::path(cfg.run.dir) / "deck.yaml").string(), deck_yaml,
                                    /*durable=*/false);
  std::error_code ec;
  if (world_rank == 0) fs::remove(fs::path(cfg.run.dir) / "exit_status", ec);
  if (failure = agree_on_failure(world_comm, failure); !failure.empty())
    throw UserError(failure, kExitIO);
  // <run.dir>/exit_status: how this run ended (0 done, 3 stopped for a requeue, 130 SIGINT), for
  // job scripts whose launcher does not pass the ranks' status on (MPICH's mpiexec reports 0
  // after it forwarded a signal). Written by rank 0; a write that fails is every rank's error.
  auto write_exit_status = [&](int status) {
    std::string why = log.failure();
    if (world_rank == 0 && why.empty())
      why = write_file_atomically((fs::path(cfg.run.dir) / "exit_status").string(),
                                  std::to_string(status) + "\n", /*durable=*/false);
    if (why = agree_on_failure(world_comm, why); !why.empty()) throw UserError(why, kExitIO);
    return status;
  };
  // Before the first step a stop signal ends the job at once, with its status: there is nothing
  // to checkpoint yet (the scan, the allocation, the read of the checkpoint may each take long).
  auto stop_point = [&](const char* during) {
    int stop = signalled_stop();
    MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, world_comm);
    if (stop == kNone) return;
    const int status = write_exit_status(stop_status(stop));
    throw UserError(std::string("stop: ") + kStopWhy[stop] + " during start-up (" + during +
                        "): no checkpoint written, exit " + std::to_string(status) +
                        (status == kExitRequeue ? " (requeue to continue)" : ""),
                    status);
  };
  stop_point("opening the data");

  // Every token id against the vocabulary, each rank a share, before anything is allocated: a bad
  // id is one message naming its file and offset, not a crash hours into the run.
  const auto t_check = Clock::now();
  uint64_t checked_tokens = 0;
  uint32_t max_id = 0;
  if (cfg.data.check_tokens) {
    const Heartbeat beat(world_rank == 0, "data: checking the token ids of " + cfg.data.train +
                                              (val_data ? " and " + cfg.data.val : "") +
                                              " against vocab " + std::to_string(vocab));
    const auto interrupted = [] { return stop_signal() != 0; };
    for (const TokenSource& s : train_data.sources()) {
      max_id = std::max(max_id, check_token_ids(world_comm, s, vocab, interrupted));
      checked_tokens += s.num_tokens();
      stop_point("the token scan");
    }
    if (val_data) {
      max_id = std::max(max_id, check_token_ids(world_comm, *val_data, vocab, interrupted));
      checked_tokens += val_data->num_tokens();
      stop_point("the token scan");
    }
  }
  const double check_seconds = seconds_since(t_check);

  engine->allocate();
  float* params = engine->host_params();  // fp32, host: initialised or read here
  const bool writer = me.dp_rank == 0;  // one rank of each data-parallel group writes its tile
  stop_point("allocating the model");

  // --- start: fresh or from a checkpoint of any layout ---
  TrainState state;
  state.seed = cfg.train.seed;
  // A bad checkpoint is refused before anything is printed.
  const auto t_read = Clock::now();
  std::string restored_layout;
  CheckpointInfo init_info;
  if (!init_from.empty()) {
    const Heartbeat beat(world_rank == 0, "init: reading " + init_from);
    init_info = read_checkpoint(world_comm, init_from, tile, writer, {params, nullptr, nullptr},
                                cfg.checkpoint.collective_bytes);
  }
  if (!restart_from.empty()) {
    const Heartbeat beat(world_rank == 0, "restart: reading " + restart_from);
    std::vector<float> m(engine->buffer_size()), v(engine->buffer_size());
    const CheckpointInfo info =
        read_checkpoint(world_comm, restart_from, tile, writer, {params, m.data(), v.data()},
                        cfg.checkpoint.collective_bytes);
    engine->set_moments(m, v);
    state = info.state;
    restored_layout = info.saved_layout;
    train_data.reseed(state.seed);
    stop_point("reading the checkpoint");
  }
  const double read_seconds = seconds_since(t_read);

  if (shape.arch == Arch::Llama)
    log.say("tessera: llama, %d layers, %d heads (%d key/value), n_embd %d, ffn %d, vocab %d "
            "(padded %d), %s head: %.2fM parameters",
            shape.n_layer, shape.n_head, shape.n_kv_head, shape.n_embd, shape.ffn_hidden,
            shape.vocab_size, shape.padded_vocab, shape.tied ? "tied" : "untied",
            tile.canonical.total / 1e6);
  else
    log.say("tessera: %d layers, %d heads, n_embd %d, vocab %d (padded %d)%s: %.2fM parameters",
            shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size, shape.padded_vocab,
            shape.tied ? "" : ", untied head", tile.canonical.total / 1e6);
  log.say("layout: %s on %d ranks, %s schedule%s, %d micro-batches of %d per dp rank%s",
          layout_name(layout).c_str(), world_size, cfg.parallel.schedule.c_str(),
          v > 1 ? (" interleaved over " + std::to_string(v) + " virtual stages").c_str() : "",
          n_micro, mb, cfg.parallel.zero == 1 ? ", ZeRO-1" : "");
  if (world_size > 1) {
    std::vector<std::vector<std::pair<int, int>>> chunks(stage_chunks.size());
    for (size_t s = 0; s < stage_chunks.size(); ++s)
      for (const LayerRange& r : stage_chunks[s]) chunks[s].emplace_back(r.begin, r.end);
    // What the first and last stages hold besides their layers.
    const bool llama = shape.arch == Arch::Llama;
    const std::string norm = llama ? "norm" : "ln_f";
    const std::string embed = llama ? "embed_tokens" : "wte, wpe";
    const std::string last_only = shape.tied ? (llama ? "embed_tokens copy, " : "wte copy, ") + norm
                                             : norm + ", lm_head";
    const std::string both = embed + ", " + (shape.tied ? norm : norm + ", lm_head");
    log.say("%s", topo.rank_grid(chunks, embed, last_only, both).c_str());
  }
  if (!backend.note.empty()) log.say("%s", backend.note.c_str());
  if (cfg.parallel.sequence_parallel)
    log.say(layout.tp > 1 ? "sequence parallel: norms and residuals on %d of every %d rows per rank"
                          : "warning: parallel.sequence_parallel has no effect with tp = 1 "
                            "(%d of %d rows per rank)",
            mb * T / layout.tp, mb * T);
  log.say("memory (rank 0): parameters %.1f MB, gradients %.1f MB, Adam moments %.1f MB, "
          "activations %.1f MB (%s attention, recompute %s)",
          4.0 * tile.total / 1e6, 4.0 * tile.total / 1e6, engine->moment_bytes() / 1e6,
          engine->activation_bytes() / 1e6, cfg.model.attention.c_str(),
          cfg.train.recompute.c_str());
  log.say("plan (rank 0): %s", memory_line(planned).c_str());
  if (const std::string report = engine->memory_report(); !report.empty())
    log.say("%s", report.c_str());
  for (size_t s = 0; s < train_data.sources().size(); ++s) {
    const TokenSource& src = train_data.sources()[s];
    log.say("data: %s: %s, %d-bit, %llu tokens in %zu file%s, %llu windows of %d, weight %.4g",
            src.spec().c_str(), format_name(src.format()), 8 * src.token_bytes(),
            (unsigned long long)src.num_tokens(), src.files().size(),
            src.files().size() == 1 ? "" : "s", (unsigned long long)src.num_windows(T), T + 1,
            train_data.entries()[s].weight);
  }
  if (val_data)
    log.say("data: val %s: %s, %llu tokens", val_data->spec().c_str(),
            format_name(val_data->format()), (unsigned long long)val_data->num_tokens());
  if (cfg.data.check_tokens)
    log.say("data: %llu token ids checked below vocab %d in %.2f s (largest %u)",
            (unsigned long long)checked_tokens, vocab, check_seconds, max_id);
  std::string job;
  for (const char* var : {"SLURM_JOB_ID", "SLURM_RESTART_COUNT", "PBS_JOBID", "PBS_RUN_COUNT"})
    if (const char* v = std::getenv(var)) job += std::string(job.empty() ? "" : " ") + var + "=" + v;
  if (!job.empty()) log.say("job: %s", job.c_str());
  for (const std::string& note : dirs.notes()) log.say("%s", note.c_str());
  if (!restart_from.empty()) {
    if (state.seed != cfg.train.seed)
      log.say("restart: note: checkpoint seed %llu kept (deck says %llu)",
              (unsigned long long)state.seed, (unsigned long long)cfg.train.seed);
    log.say("restart: %s at step %lld, saved on %s (read in %.2f s)", restart_from.c_str(),
            (long long)state.step, restored_layout.c_str(), read_seconds);
    log.say("restart: data resumes at global sample %lld (%s)", (long long)state.next_sample,
            train_data.position(uint64_t(state.next_sample)).c_str());
    if (!state.data_sources.empty() && state.data_sources != train_data.describe())
      log.say("restart: note: the training data changed since the checkpoint (it read: %s); the "
              "new data continues from global sample %lld",
              state.data_sources.c_str(), (long long)state.next_sample);
  } else if (!init_from.empty()) {
    log.say("init: weights from %s (step %lld of its run, saved_layout '%s'), fresh optimizer, step 0 "
            "(read in %.2f s)",
            init_from.c_str(), (long long)init_info.state.step, init_info.saved_layout.c_str(),
            read_seconds);
    if (init_info.tokenizer.type != "none" && init_info.tokenizer.type != tokenizer.type)
      log.say("init: note: the weights come with tokenizer '%s', the training data has '%s'",
              init_info.tokenizer.type.c_str(), tokenizer.type.c_str());
  } else {
    const auto t0 = Clock::now();
    init_local_parameters(params, tile, cfg.train.seed, cfg.model.init_std);
    log.say("init: fresh model from seed %llu (%.2f s)", (unsigned long long)cfg.train.seed,
            seconds_since(t0));
  }
  engine->params_to_device();

  double peak_gflops = cfg.log.peak_gflops;
  const char* peak_from = "log.peak_gflops";
  if (peak_gflops <= 0) {
    // A GPU's datasheet figure for its precision (0 on the CPU, or a GPU not in the table),
    // else the CPU's sgemm measured now.
    peak_gflops = engine->peak_gflops();
    peak_from = "GPU datasheet";
    if (peak_gflops <= 0) {
      peak_gflops = measure_sgemm_gflops(0.5);
      peak_from = "sgemm measured now";
    }
    MPI_Bcast(&peak_gflops, 1, MPI_DOUBLE, 0, world_comm);  // one figure for the whole job
  }
  log.say("peak: %.1f GFLOP/s per rank (%s) on %d threads", peak_gflops, peak_from,
          omp_get_max_threads());
  const double flops_token = flops_per_token(shape, T);

  const LrSchedule schedule_lr{cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps,
                               cfg.optim.decay_steps > 0 ? cfg.optim.decay_steps : cfg.train.steps};
  const bool speaks_loss = tile.last && me.tp_rank == 0;  // one copy of each dp group's loss

  // checkpoint.keep: the older complete checkpoints go once a newer one is complete.
  // Collective over comm; returns the lines for the log.
  auto prune = [&](MPI_Comm comm) {
    std::vector<std::string> lines;
    if (cfg.checkpoint.keep <= 0) return lines;
    std::string why;
    if (world_rank == 0) try {
        for (const std::string& name : prune_checkpoints(ckpt_dir, cfg.checkpoint.keep))
          lines.push_back("checkpoint: removed " + name + " (checkpoint.keep = " +
                          std::to_string(cfg.checkpoint.keep) + ")");
      } catch (const UserError& e) {
        why = e.what();
      }
    if (why = agree_on_failure(comm, why); !why.empty()) throw UserError(why, kExitIO);
    return lines;
  };
  // checkpoint.async (train/async_writer.hpp): the write in flight is waited for, at the same
  // point on every rank, before the next checkpoint, a rollback, a stop and the end.
  int thread_level = 0;
  MPI_Query_thread(&thread_level);
  std::unique_ptr<AsyncWriter> background;
  if (cfg.checkpoint.async && thread_level >= MPI_THREAD_MULTIPLE) {
    background = std::make_unique<AsyncWriter>(world_comm);
    // The snapshot's memory taken and touched now: first-touching 1.5 GB (GPT-2 124M) inside the
    // first checkpoint's stall cost more than the copy itself.
    for (std::vector<float>* b : {&background->params, &background->exp_avg, &background->exp_avg_sq})
      b->assign(engine->buffer_size(), 0.0f);
  }
  else if (cfg.checkpoint.async)
    log.say("%s", "warning: checkpoint.async needs MPI_THREAD_MULTIPLE, which this MPI library "
                  "does not give: checkpoints are written synchronously");
  double last_write_seconds = 0;
  auto finish_write = [&] {
    if (!background || !background->busy()) return;
    const Heartbeat beat(world_rank == 0, "checkpoint: waiting for the background write");
    for (const std::string& line : background->wait(&last_write_seconds))
      log.say("%s", line.c_str());
  };
  auto save = [&] {
    trace::set_phase("checkpoint write");
    const auto t0 = Clock::now();
    state.data_sources = train_data.describe();
    state.data_position = train_data.position(uint64_t(state.next_sample));
    if (background) {
      // A second checkpoint waits for the first; then the snapshot, and training goes on.
      finish_write();
      const float* p = engine->params_to_host();
      background->params.assign(p, p + engine->buffer_size());
      engine->get_moments(background->exp_avg, background->exp_avg_sq);
      const TrainState snapshot = state;
      AsyncWriter* w = background.get();
      background->start([&, w, snapshot](MPI_Comm comm) {
        const auto t_write = Clock::now();
        const std::string path = write_checkpoint(
            comm, ckpt_dir, tile, writer, {w->params.data(), w->exp_avg.data(), w->exp_avg_sq.data()},
            snapshot, deck_yaml, tokenizer, layout_name(layout), cfg.checkpoint.collective_bytes,
            cfg.checkpoint.reserve);
        std::error_code size_ec;
        std::vector<std::string> lines = {
            "checkpoint: wrote " + path + " (" +
            fmt("%.1f", world_rank == 0 ? fs::file_size(path, size_ec) / 1e6 : 0.0) + " MB) in " +
            fmt("%.2f", seconds_since(t_write)) + " s in the background"};
        for (std::string& line : prune(comm)) lines.push_back(std::move(line));
        return lines;
      });
      const double stall = seconds_since(t0);
      log.say("checkpoint: step %lld copied to the host in %.3f s (training stalled %.3f s); "
              "writing in the background", (long long)state.step, stall, stall);
      return;
    }
    const Heartbeat beat(world_rank == 0, "checkpoint: writing step " + std::to_string(state.step) +
                                              " to " + ckpt_dir);
    std::vector<float> m, v;
    engine->get_moments(m, v);
    float* saved = engine->params_to_host();
    const std::string path =
        write_checkpoint(world_comm, ckpt_dir, tile, writer, {saved, m.data(), v.data()},
                         state, deck_yaml, tokenizer, layout_name(layout),
                         cfg.checkpoint.collective_bytes, cfg.checkpoint.reserve);
    log.say("checkpoint: wrote %s (%.1f MB) in %.2f s", path.c_str(),
            world_rank == 0 ? fs::file_size(path, ec) / 1e6 : 0.0, seconds_since(t0));
    for (const std::string& line : prune(world_comm)) log.say("%s", line.c_str());
  };
  auto evaluate = [&] {
    if (!val_data) return;
    trace::set_phase("evaluation");
    const auto t0 = Clock::now();
    const Heartbeat beat(world_rank == 0, "eval: step " + std::to_string(state.step) + " on " +
                                              cfg.data.val);
    // Every layout evaluates the same windows: dp rank d takes the d-th share of them.
    const uint64_t total = eval_windows(*val_data, T, B, cfg.eval.batches);
    const uint64_t share = total / uint64_t(layout.dp);
    double sum = engine->eval_loss_sum(*val_data, vocab, share * uint64_t(me.dp_rank), share);
    if (!speaks_loss) sum = 0;
    world.all_reduce_sum(&sum, 1);
    const double loss = sum / double(total / uint64_t(mb));
    log.say("eval: step %lld val_loss %.4f (%.2f s)", (long long)state.step, loss,
            seconds_since(t0));
    log.json("{\"type\":\"eval\",\"step\":" + std::to_string(state.step) +
             ",\"tokens\":" + std::to_string(state.tokens_seen) +
             ",\"val_loss\":" + json_number("%.9g", loss) + "}");
  };

  if (restart_from.empty() && cfg.train.steps == 0) save();  // the initial model, for references
  if (state.step == 0 && cfg.train.steps > 0) evaluate();

  // Per-rank measurements for `make bench`: bytes each communicator moved during training steps
  // (not evaluation) and the pipeline's measured bubble.
  double step_bytes[4] = {}, wait_sum = 0, run_sum = 0;
  long measured_steps = 0;

  // At each step boundary the ranks agree on two things: a write that failed on any rank
  // (metrics.jsonl, the data trace) ends the run on all of them; and a stop request, a signal any
  // rank received or (rank 0's clock) a wall-time budget the next step and its checkpoint would
  // overrun. The larger request wins.
  double last_step_seconds = 0, last_save_seconds = 0;
  std::string trace_failure;
  auto step_boundary = [&] {
    if (std::string why = agree_on_failure(world_comm, world_rank == 0 && !log.failure().empty()
                                                           ? log.failure()
                                                           : trace_failure);
        !why.empty())
      throw UserError(why, kExitIO);
    int code = signalled_stop();
    if (code == kNone && world_rank == 0 && cfg.run.max_minutes > 0 &&
        seconds_since(t_start) + last_step_seconds + last_save_seconds > cfg.run.max_minutes * 60)
      code = kBudget;
    world.all_reduce_max(&code, 1);
    return code;
  };

  long last_saved = restart_from.empty() ? -1 : state.step;
  // The anomaly policy (train.anomaly_*, README "Long runs"). The test triggers exist only for
  // the test suites: TESSERA_TEST_NAN_STEP=N makes step N's gradients NaN, TESSERA_TEST_SPIKE_STEP=N
  // multiplies them by 10^4, each once per job (a rollback replays step numbers).
  AnomalyDetector detector(cfg.train.anomaly_window, cfg.train.anomaly_sigma);
  auto test_step = [](const char* var) {
    const char* v = std::getenv(var);
    return v ? std::atol(v) : -1L;
  };
  long test_nan_step = test_step("TESSERA_TEST_NAN_STEP");
  long test_spike_step = test_step("TESSERA_TEST_SPIKE_STEP");
  // More anomalous steps in a row than this is not a passing spike: the run stops.
  constexpr int kAnomaliesInARow = 10;
  int anomalies_in_a_row = 0;
  auto kept_checkpoint = [&] {
    const std::string newest = resolve_checkpoint(ckpt_dir);
    return newest.empty() ? std::string("no checkpoint to keep")
                          : "kept " + fs::path(newest).filename().string();
  };
  // Rollback: the weights, moments and step of the newest complete checkpoint; the data goes on
  // after the anomalous batch, so that the batches between (PaLM's remedy for a spike) are skipped.
  // Returns the checkpoint's path, "" when there is none.
  int64_t rolled_from = 0;
  auto rollback = [&] {
    finish_write();
    const std::string path = resolve_checkpoint(ckpt_dir);
    if (path.empty()) return path;
    const Heartbeat beat(world_rank == 0, "rollback: reading " + path);
    std::vector<float> m(engine->buffer_size()), v(engine->buffer_size());
    const CheckpointInfo info = read_checkpoint(world_comm, path, tile, writer,
                                                {params, m.data(), v.data()},
                                                cfg.checkpoint.collective_bytes);
    engine->set_moments(m, v);
    engine->params_to_device();
    const int64_t next = state.next_sample;
    rolled_from = info.state.next_sample;
    state = info.state;
    state.next_sample = next;
    last_saved = -1;  // the data position differs from the checkpoint's: a stop writes anew
    return path;
  };

  std::vector<HostMicroBatch> views(static_cast<size_t>(n_micro));
  // This dp rank's share of each global batch: samples [first, first + n_micro * mb) of the
  // step, read ahead by the loader thread.
  std::unique_ptr<Prefetcher> loader;
  if (reads_tokens)
    loader = std::make_unique<Prefetcher>(
        train_data, vocab, uint64_t(state.next_sample) + uint64_t(me.dp_rank) * n_micro * mb,
        uint64_t(B), n_micro * mb, cfg.data.prefetch, cfg.data.readers, cfg.data.direct_io,
        engine->loader_memory());
  AppendFile trace;
  if (cfg.data.trace && reads_tokens && tile.first && me.tp_rank == 0)
    trace_failure = trace.open(
        (fs::path(cfg.run.dir) / ("data_trace.rank" + std::to_string(world_rank) + ".txt")).string());
  double data_wait = 0, interval_seconds = 0;
  // The ETA: the wall time per step of this job so far (evaluations and checkpoints included).
  const auto t_loop = Clock::now();
  const int64_t first_step = state.step;
  bool loader_logged = false;
  // Every micro-batch's gradient is scaled so that the sum over the job is that of the mean
  // over the global batch's B*T positions.
  const float dloss = 1.0f / float(size_t(B) * T);
  // Hang forensics (run.hang_timeout): the watchdog runs while the steps do. TESSERA_TEST_STALL=
  // RANK:STEP (for the test suites only) stalls that rank at the start of that step.
  std::unique_ptr<Watchdog> watchdog;
  if (cfg.run.hang_timeout > 0) {
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      log.say("%s", "warning: the MPI library gives no MPI_THREAD_MULTIPLE: the hang watchdog "
                    "calls MPI_Abort from its own thread all the same");
    watchdog = std::make_unique<Watchdog>(cfg.run.dir, world_rank, world_size, cfg.run.hang_timeout);
  }
  long stall_rank = -1, stall_step = -1;
  if (const char* v = std::getenv("TESSERA_TEST_STALL"))
    if (std::sscanf(v, "%ld:%ld", &stall_rank, &stall_step) != 2) stall_rank = -1;
  bool hang_warned = false;
  while (state.step < cfg.train.steps) {
    trace::set_phase("step boundary");
    if (const int stop = step_boundary(); stop != kNone) {
      if (last_saved != state.step) save();
      finish_write();  // a stop ends with a complete checkpoint
      const int status = stop_status(stop);
      log.say("stop: %s at step %lld: checkpoint written, exit %d%s", kStopWhy[stop],
              (long long)state.step, status, status == kExitRequeue ? " (requeue to continue)" : "");
      return write_exit_status(status);
    }
    trace::set_step(state.step + 1);
    trace::set_phase("training step");
    if (world_rank == stall_rank && state.step + 1 == stall_step) {
      trace::set_phase("stalled on purpose (TESSERA_TEST_STALL)");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const auto t0 = Clock::now();
    double bytes_before[4];
    for (int c = 0; c < 4; ++c) bytes_before[c] = engine->payload_bytes(c);
    if (loader) {
      const StepSamples& samples = loader->next();
      data_wait += loader->take_wait_seconds();
      if (!loader_logged) log.say("loader: %s", loader->mode().c_str());
      loader_logged = true;
      for (int k = 0; k < n_micro; ++k)
        views[size_t(k)] = {samples.inputs + size_t(k) * mb * T,
                            samples.targets + size_t(k) * mb * T};
      if (trace.is_open() && trace_failure.empty()) {
        std::string lines;
        for (size_t i = 0; i < samples.refs.size(); ++i) {
          lines += std::to_string(state.step + 1) + ' ' + std::to_string(samples.first + i) + ' ' +
                   std::to_string(samples.refs[i].source) + ' ' +
                   std::to_string(samples.refs[i].window) + ':';
          for (int t = 0; t < T; ++t)
            lines += ' ' + std::to_string(samples.inputs[i * size_t(T) + size_t(t)]);
          lines += ' ' + std::to_string(samples.targets[i * size_t(T) + size_t(T - 1)]) + '\n';
        }
        trace_failure = trace.append(lines);
      }
    }
    // Forward and backward through the pipeline, the gradient sums, the norm, clipping and
    // AdamW, on the engine's backend (train/engine.hpp). The anomaly policy judges the loss and
    // the norm before the update: every rank the same reduced numbers, and a MAX to be sure.
    state.lr = schedule_lr.at(state.step);
    float step_dloss = dloss;
    if (state.step + 1 == test_nan_step) step_dloss = NAN, test_nan_step = -1;
    if (state.step + 1 == test_spike_step) step_dloss *= 1e4f, test_spike_step = -1;
    double loss = 0;
    std::string anomaly;
    auto check = [&](double stage_loss, double step_norm) {
      loss = speaks_loss ? stage_loss : 0;
      world.all_reduce_sum(&loss, 1);
      loss /= double(n_micro) * layout.dp;
      anomaly = detector.judge(loss, step_norm);
      int bad = !anomaly.empty();
      world.all_reduce_max(&bad, 1);
      if (bad && anomaly.empty()) anomaly = "another rank judged it anomalous";
      return bad == 0;
    };
    const TrainEngine::StepResult result =
        engine->train_step(views, step_dloss, cfg.optim.grad_clip, state.lr, state.step + 1, check);
    const double norm = result.norm;
    for (int c = 0; c < 4; ++c) step_bytes[c] += engine->payload_bytes(c) - bytes_before[c];
    if (measured_steps++ > 0) {  // the first step warms up
      wait_sum += engine->wait_seconds();
      run_sum += engine->run_seconds();
    }
    if (!anomaly.empty()) {
      // The update was dropped on every rank; the batch is consumed whatever the action.
      const int64_t attempted = state.step + 1, from = state.next_sample;
      state.next_sample += B;
      const std::string action = cfg.train.anomaly_action;
      std::string outcome;
      int stop_status = 0;
      if (++anomalies_in_a_row > kAnomaliesInARow) {
        outcome = "stop: " + std::to_string(anomalies_in_a_row) + " anomalous steps in a row";
        stop_status = kExitAnomaly;
      } else if (action == "skip") {
        outcome = "skip: update dropped, global samples [" + std::to_string(from) + ", " +
                  std::to_string(state.next_sample) + ") skipped";
      } else if (action == "rollback") {
        const std::string path = rollback();
        if (path.empty()) {
          outcome = "rollback: no checkpoint in " + ckpt_dir + " to roll back to: stop";
          stop_status = kExitAnomaly;
        } else {
          outcome = "rollback: to " + path + " (step " + std::to_string(state.step) +
                    "), global samples [" + std::to_string(rolled_from) + ", " +
                    std::to_string(state.next_sample) + ") skipped";
        }
      } else {
        outcome = "stop";
        stop_status = kExitAnomaly;
      }
      if (stop_status != 0)
        outcome += ": no checkpoint written, " + kept_checkpoint() + ", exit " +
                   std::to_string(stop_status);
      log.say("anomaly: step %lld: %s (loss %.4f, grad_norm %.4g): %s", (long long)attempted,
              anomaly.c_str(), loss, norm, outcome.c_str());
      log.json("{\"type\":\"anomaly\",\"step\":" + std::to_string(attempted) +
               ",\"loss\":" + json_number("%.17g", loss) +
               ",\"grad_norm\":" + json_number("%.9g", norm) + ",\"reason\":\"" + anomaly +
               "\",\"action\":\"" + (stop_status != 0 ? "stop" : action) + "\"}");
      if (stop_status != 0) {
        finish_write();
        return write_exit_status(stop_status);
      }
      continue;
    }
    anomalies_in_a_row = 0;
    detector.accept(loss, norm);
    state.step += 1;
    state.next_sample += B;
    state.tokens_seen += int64_t(B) * T;

    const double secs = seconds_since(t0);
    last_step_seconds = secs;
    if (watchdog && !hang_warned && secs > cfg.run.hang_timeout) {
      log.say("warning: step %lld took %.1f s, longer than run.hang_timeout = %g s: the watchdog "
              "may end a healthy run", (long long)state.step + 1, secs, cfg.run.hang_timeout);
      hang_warned = true;
    }
    interval_seconds += secs;
    const double tok_s = double(B) * T / secs;
    const double mfu = flops_token * tok_s / (peak_gflops * 1e9 * world_size);
    if (state.step % cfg.log.every == 0 || state.step == 1 || state.step == cfg.train.steps) {
      // The loader's wait is rank 0's (a first-stage rank: it reads tokens) over the interval.
      const double wait_fraction = interval_seconds > 0 ? data_wait / interval_seconds : 0;
      const double per_step = seconds_since(t_loop) / double(state.step - first_step);
      log.say("step %6lld/%d | loss %.4f | lr %.3e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%% "
              "| data wait %.2f%% | %s elapsed, ETA %s",
              (long long)state.step, cfg.train.steps, loss, state.lr, norm, secs * 1e3, tok_s,
              mfu * 100, wait_fraction * 100, clock_time(seconds_since(t_start)).c_str(),
              clock_time(per_step * double(cfg.train.steps - state.step)).c_str());
      log.json("{\"type\":\"train\",\"step\":" + std::to_string(state.step) +
               ",\"tokens\":" + std::to_string(state.tokens_seen) +
               ",\"elapsed_s\":" + json_number("%.3f", seconds_since(t_start)) +
               ",\"loss\":" + json_number("%.17g", loss) +
               ",\"lr\":" + json_number("%.9g", state.lr) +
               ",\"grad_norm\":" + json_number("%.9g", norm) +
               ",\"ms\":" + json_number("%.3f", secs * 1e3) +
               ",\"tokens_per_s\":" + json_number("%.1f", tok_s) +
               ",\"mfu\":" + json_number("%.5f", mfu) +
               ",\"pipeline_wait\":" + json_number("%.5f", engine->wait_seconds() / secs) +
               ",\"data_wait\":" + json_number("%.6f", wait_fraction) + "}");
      data_wait = interval_seconds = 0;
    }
    const bool last = state.step == cfg.train.steps;
    if (cfg.eval.every > 0 && state.step % cfg.eval.every == 0 && !last) evaluate();
    if ((cfg.checkpoint.every > 0 && state.step % cfg.checkpoint.every == 0) || last) {
      const auto t_save = Clock::now();
      save();
      last_saved = state.step;
      // The budget keeps room for a whole write: the stop waits for it.
      last_save_seconds = background ? std::max(seconds_since(t_save), last_write_seconds)
                                     : seconds_since(t_save);
    }
    if (last) evaluate();
  }
  if (last_saved != state.step && cfg.train.steps > 0) save();
  finish_write();
  watchdog.reset();

  // One line per rank in metrics.jsonl: its memory, its bytes per step on each communicator
  // (payload handed to MPI), and its pipeline bubble.
  const double n = double(std::max(1L, measured_steps));
  const double mine[] = {double(me.dp_rank), double(me.tp_rank), double(me.pp_rank),
                         4.0 * tile.total, 4.0 * tile.total, double(engine->moment_bytes()),
                         double(engine->activation_bytes()), step_bytes[0] / n, step_bytes[1] / n,
                         step_bytes[2] / n, step_bytes[3] / n,
                         run_sum > 0 ? wait_sum / run_sum : 0.0, double(n_micro)};
  constexpr int kStats = sizeof(mine) / sizeof(mine[0]);
  std::vector<double> all(size_t(kStats) * world_size);
  MPI_Gather(mine, kStats, MPI_DOUBLE, all.data(), kStats, MPI_DOUBLE, 0, world_comm);
  const char* names[kStats] = {"dp_rank", "tp_rank", "pp_rank", "param_bytes", "grad_bytes",
                               "optim_bytes", "activation_bytes", "tp_bytes_per_step",
                               "dp_bytes_per_step", "pp_bytes_per_step", "embed_bytes_per_step",
                               "pipeline_bubble", "micro_batches"};
  for (int r = 0; r < world_size; ++r) {
    std::string line = "{\"type\":\"rank\",\"rank\":" + std::to_string(r);
    for (int k = 0; k < kStats; ++k)
      line += std::string(",\"") + names[k] + "\":" + json_number("%.6g", all[size_t(r) * kStats + k]);
    log.json(line + "}");
  }
  log.say("done: %lld steps, %.1f s", (long long)state.step, seconds_since(t_start));
  return write_exit_status(0);
}

}  // namespace tessera
