// The set-up of a run (train/run.hpp), bottom-up and once: the device, the data and its
// vocabulary, the model's shape, the layout and this rank's tile and schedule, the checkpoint to
// start from, the engine's buffers declared and checked against the node's memory, the run
// directory and the deck written into it, the scan of every token id, the one allocation. Every
// error a user can cause is found here, before anything is allocated or written; a stop signal
// meanwhile ends the job at once with its status.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/error.hpp"
#include "common/memory.hpp"
#include "train/heartbeat.hpp"
#include "train/run.hpp"
#include "train/signals.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

const char* const kStopWhy[] = {"", "wall-time budget run.max_minutes reached", "SIGINT",
                                "SIGTERM", "SIGUSR1"};

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

}  // namespace

const char* stop_why(int stop) { return kStopWhy[stop]; }

int signalled_stop() {
  switch (stop_signal()) {
    case SIGUSR1: return kSigusr1;
    case SIGTERM: return kSigterm;
    case SIGINT: return kSigint;
  }
  return kNone;
}

int stop_status(int stop) { return stop == kSigint ? kExitInterrupted : kExitRequeue; }

Run::Run(MPI_Comm world, const Config& cfg)
    : world_comm_(world), cfg_(cfg), T_(cfg.data.seq_len), B_(cfg.train.batch_size),
      anomaly_(cfg.train), faults_(FaultInjection::from_environment()) {
  MPI_Comm_rank(world, &world_rank_);
  MPI_Comm_size(world, &world_size_);
  backend_ = device::choose_backend(cfg, world);  // may refuse
  device::activate(backend_);  // CUDA: this rank's GPU, stream and cuBLAS handle
  if (cfg.device.threads > 0) omp_set_num_threads(cfg.device.threads);
  t_start_ = Clock::now();
  // Everything checked before anything is allocated.
  open_data();
  lay_out();
  find_checkpoints();
  declare_engine();
  open_run_dir();
  stop_point("opening the data");
  scan_tokens();
  engine_->allocate();
  writer_ = engine_->writes_state();
  stop_point("allocating the model");
}

void Run::open_data() {
  train_data_ = std::make_unique<Dataset>(cfg_.data.train, cfg_.data.format, cfg_.data.dtype, T_,
                                          cfg_.train.seed);
  if (cfg_.data.windows == Windows::Documents) train_data_->use_document_windows();
  if (!cfg_.data.val.empty())
    val_data_ = std::make_unique<TokenSource>(cfg_.data.val, cfg_.data.format, cfg_.data.dtype);
  const TokenSource& first = train_data_->sources().front();
  const int data_vocab = int(tokenizer().vocab_size);
  if (data_vocab == 0 && cfg_.model.vocab_size == 0)
    throw UserError(cfg_.data.train + ": " + format_name(first.format()) +
                    " data does not record its vocabulary size; set model.vocab_size");
  vocab_ = cfg_.model.vocab_size > 0 ? cfg_.model.vocab_size : data_vocab;
  // An HDF5 token file records its tokenizer; an llm.c header only implies GPT-2's (or LLaMA-3's)
  // vocabulary, so there the deck may set a smaller one and the token check below decides.
  if (data_vocab > vocab_ && first.format() == TokenFormat::hdf5)
    throw UserError(cfg_.data.train + ": tokenizer vocab_size " + std::to_string(data_vocab) +
                    " exceeds model.vocab_size " + std::to_string(vocab_));
  if (val_data_ && val_data_->tokenizer().vocab_size != tokenizer().vocab_size)
    throw UserError(cfg_.data.val + ": tokenizer vocab_size " +
                    std::to_string(val_data_->tokenizer().vocab_size) +
                    " differs from data.train's " + std::to_string(data_vocab));
  // The document mask finds documents by their end-of-text token.
  if (cfg_.data.document_mask && tokenizer().eot < 0)
    throw UserError(cfg_.deck_path + ": data.document_mask: " + cfg_.data.train +
                    " records no end-of-text token (eot), so its documents cannot be told apart");
  shape_ = make_model_shape(cfg_.model, vocab_);
}

// The layout of the world's ranks, the checks it must pass against the deck (engine/run_layout),
// and this rank's place in it: its communicators, its tile of the model, its stage's schedule.
void Run::lay_out() {
  ParallelLayout layout;
  if (std::string e = resolve_layout(cfg_.parallel, world_size_, &layout); !e.empty())
    throw UserError(cfg_.deck_path + ": " + e);
  if (std::string e = make_run_layout(cfg_, shape_, layout, &run_); !e.empty())
    throw UserError(cfg_.deck_path + ": " + e);
  mesh_ = std::make_unique<Mesh>(world_comm_, mesh_shape(layout));
  world_ = std::make_unique<Comm>(world_comm_);
  tile_ = rank_tile(run_, shape_, mesh_->coord("tp"), mesh_->coord("pp"),
                    mesh_->shape().has("ep") ? mesh_->coord("ep") : 0);
  schedule_ = rank_schedule(cfg_, run_, mesh_->coord("pp"));
  // The document mask comes from the tokens, and every stage's attention needs it.
  reads_tokens_ = tile_.first || tile_.last || cfg_.data.document_mask;
  speaks_loss_ = tile_.last && mesh_->coord("tp") == 0;
  schedule_lr_ = {cfg_.optim.lr, cfg_.optim.min_lr, cfg_.optim.warmup_steps,
                  cfg_.optim.decay_steps > 0 ? cfg_.optim.decay_steps : cfg_.train.steps};
}

// The checkpoint to start from, and whether its model has the deck's shape: an attribute read,
// so that a wrong checkpoint is refused before anything is written.
void Run::find_checkpoints() {
  ckpt_dir_ = cfg_.checkpoint.dir.empty() ? (fs::path(cfg_.run.dir) / "checkpoints").string()
                                          : cfg_.checkpoint.dir;
  if (restart_from(cfg_.checkpoint) == RestartFrom::Auto) {
    // Rank 0 verifies the newest checkpoint (every tensor's checksum) and passes a damaged one
    // over for the one before: a job script that restarts after every failure must not be
    // stopped by a checkpoint that a failure damaged.
    std::vector<std::string> skipped;
    std::string why;
    if (world_rank_ == 0) try {
        restart_from_ = newest_sound_checkpoint(ckpt_dir_, &skipped);
      } catch (const UserError& e) {
        why = e.what();
      }
    if (why = agree_on_failure(world_comm_, why); !why.empty()) throw UserError(why, kExitIO);
    for (const std::string& line : skipped) std::printf("%s\n", line.c_str());
    int length = int(restart_from_.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, world_comm_);
    restart_from_.resize(size_t(length));
    MPI_Bcast(restart_from_.data(), length, MPI_CHAR, 0, world_comm_);
  } else if (restart_from(cfg_.checkpoint) == RestartFrom::Path) {
    restart_from_ = resolve_checkpoint(cfg_.checkpoint.restart);
    if (restart_from_.empty())
      throw UserError(cfg_.deck_path + ": checkpoint.restart = " + cfg_.checkpoint.restart +
                          ": no such checkpoint file or directory with one",
                      kExitIO);
  }
  // checkpoint.init_from: a new run (step 0, fresh AdamW, this deck's seed and data order) from the
  // weights of another run or of tools/interop/import_weights.py. A checkpoint of this run comes first,
  // so a requeued fine-tuning job continues where it stopped.
  if (restart_from_.empty() && !cfg_.checkpoint.init_from.empty()) {
    init_from_ = resolve_checkpoint(cfg_.checkpoint.init_from);
    if (init_from_.empty())
      throw UserError(cfg_.deck_path + ": checkpoint.init_from = " + cfg_.checkpoint.init_from +
                          ": no such checkpoint file or directory with one",
                      kExitIO);
  }
  if (!restart_from_.empty()) {
    const CheckpointInfo info = read_checkpoint_info(restart_from_);
    check_checkpoint_shape(info, tile_);
    // optim.reset_state: a state the rule cannot take is started afresh (Run::restore).
    if (cfg_.optim.reset_state) require_optimizer_state(info);
    else require_optimizer_state(info, deck_word(cfg_.optim.name), rule_state(optim_hyper(cfg_.optim)));
  }
  if (!init_from_.empty()) {
    const CheckpointInfo info = read_checkpoint_info(init_from_);
    check_checkpoint_shape(info, tile_);
    // Weights trained on other ids would be fine-tuned on text they cannot read.
    if (std::string e = tokenizer_mismatch(tokenizer(), "data.train " + cfg_.data.train,
                                           info.tokenizer, "checkpoint.init_from " + init_from_);
        !e.empty())
      throw UserError(cfg_.deck_path + ": " + e +
                      " (tokenize the data with the weights' tokenizer: tools/data/prepare_data.py "
                      "--tokenizer tokenizer.json)");
  }
}

// The model, pipeline executor and optimizer of the chosen backend (engine/engine.hpp): every
// buffer declared now, checked against the memory of the node, allocated once later. The plan's
// count of this rank (engine/memory.hpp: the same declarations, made without allocating) is what
// is checked: the engine's buffers, the loader's ring, and the Adam moments copied out for a
// checkpoint (or in from one).
void Run::declare_engine() {
  EngineSetup setup = engine_setup(cfg_, run_, tile_, mesh_->coord("pp"));
  setup.mesh = mesh_.get();
  if (cfg_.data.document_mask) setup.document_eot = tokenizer().eot;
  const EngineKind kind = engine_kind(cfg_, backend_.cuda);
  engine_ = make_engine(setup, kind, Allocation::later);
  planned_ = rank_memory(cfg_, shape_, run_, mesh_->rank(), kind);
  if (planned_.engine_host != engine_->host_bytes() ||
      planned_.activations != engine_->activation_bytes())
    throw std::logic_error("tessera plan's count of this rank differs from its engine's");
  check_node_memory(world_comm_, planned_.engine_host, planned_.loader, planned_.checkpoint);
}

// The output places: locked, writable, with room for a checkpoint; then the deck.
void Run::open_run_dir() {
  deck_yaml_ = to_yaml(cfg_);
  dirs_ = std::make_unique<RunDirs>(world_comm_, cfg_.run.dir, ckpt_dir_,
                                    checkpoint_bytes(tile_, tokenizer(), deck_yaml_.size() + 4096));
  log_ = std::make_unique<RunLog>(world_rank_ == 0, cfg_.run.dir);
  std::string failure = log_->failure();
  if (world_rank_ == 0 && failure.empty())
    failure = write_file_atomically((fs::path(cfg_.run.dir) / "deck.yaml").string(), deck_yaml_,
                                    /*durable=*/false);
  std::error_code ec;
  if (world_rank_ == 0) fs::remove(fs::path(cfg_.run.dir) / "exit_status", ec);
  if (failure = agree_on_failure(world_comm_, failure); !failure.empty())
    throw UserError(failure, kExitIO);
}

// Every token id against the vocabulary, each rank a share, before anything is allocated: a bad
// id is one message naming its file and offset, not a crash hours into the run.
void Run::scan_tokens() {
  const auto t_check = Clock::now();
  if (cfg_.data.check_tokens) {
    const Heartbeat beat(world_rank_ == 0, "data: checking the token ids of " + cfg_.data.train +
                                               (val_data_ ? " and " + cfg_.data.val : "") +
                                               " against vocab " + std::to_string(vocab_));
    const auto interrupted = [] { return stop_signal() != 0; };
    for (const TokenSource& s : train_data_->sources()) {
      max_id_ = std::max(max_id_, check_token_ids(world_comm_, s, vocab_, interrupted));
      checked_tokens_ += s.num_tokens();
      stop_point("the token scan");
    }
    if (val_data_) {
      max_id_ = std::max(max_id_, check_token_ids(world_comm_, *val_data_, vocab_, interrupted));
      checked_tokens_ += val_data_->num_tokens();
      stop_point("the token scan");
    }
  }
  check_seconds_ = seconds_since(t_check);
}

// <run.dir>/exit_status: how this run ended (0 done, 3 stopped for a requeue, 130 SIGINT), for
// job scripts whose launcher does not pass the ranks' status on (MPICH's mpiexec reports 0
// after it forwarded a signal). Written by rank 0; a write that fails is every rank's error.
int Run::write_exit_status(int status) {
  std::string why = log_->failure();
  if (world_rank_ == 0 && why.empty())
    why = write_file_atomically((fs::path(cfg_.run.dir) / "exit_status").string(),
                                std::to_string(status) + "\n", /*durable=*/false);
  if (why = agree_on_failure(world_comm_, why); !why.empty()) throw UserError(why, kExitIO);
  return status;
}

// Before the first step a stop signal ends the job at once, with its status: there is nothing
// to checkpoint yet (the scan, the allocation, the read of the checkpoint may each take long).
void Run::stop_point(const char* during) {
  int stop = signalled_stop();
  MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, world_comm_);
  if (stop == kNone) return;
  const int status = write_exit_status(stop_status(stop));
  throw UserError(std::string("stop: ") + kStopWhy[stop] + " during start-up (" + during +
                      "): no checkpoint written, exit " + std::to_string(status) +
                      (status == kExitRequeue ? " (requeue to continue)" : ""),
                  status);
}

}  // namespace tessera
