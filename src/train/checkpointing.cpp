// A run's checkpoints (train/run.hpp): the start from one (restart, or the weights of
// checkpoint.init_from) or from the seed; writing one, synchronously or from a host snapshot by
// the background writer (checkpoint.async); checkpoint.keep's pruning; and the anomaly policy's
// rollback to the newest complete one.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/error.hpp"
#include "model/cost.hpp"
#include "model/shard.hpp"
#include "train/heartbeat.hpp"
#include "train/run.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// The first row of MoE layer l's routed experts in the checkpoint's FP8 table: after every
// layer's 12 and the head's 3, each MoE layer's before it.
size_t fp8_expert_row(const ModelShape& shape, int l) {
  return Fp8State::table_rows(shape.n_layer, moe_layers(shape, 0, l), shape.moe.experts);
}

// device.precision fp8: the amax histories of this rank's model chunks (model/fp8.hpp) into the
// layout-free table of TrainState::fp8_amax, every layer's rows in canonical order, then the
// MoE layers' experts'; gathered over the world as a max (a rank holds -1 in the rows it has no
// part of, and the ranks that hold a row hold the same values: an expert's too, its amaxes
// reduced over dp x cp with the others'). Collective; nothing without FP8.
void gather_fp8(TrainEngine& engine, MPI_Comm world, const Config& cfg, const ModelShape& shape,
                TrainState& state) {
  state.fp8_amax.clear();
  state.fp8_history = 0;
  if (cfg.device.precision != Precision::Fp8) return;
  const int H = cfg.device.fp8_amax_history, L = cfg.model.n_layer;
  const size_t rows = fp8_expert_row(shape, L);
  std::vector<float> table(rows * size_t(H), -1.0f);
  for (Fp8State* s : engine.fp8_states()) {
    auto put = [&](int layer, size_t row, bool experts) {
      const std::vector<float> h = s->history(layer, experts);
      std::copy(h.begin(), h.end(), table.begin() + long(row) * H);
    };
    for (int l = s->begin(); l < s->end(); ++l) put(l, size_t(l) * Fp8State::kPerLayer, false);
    if (s->head()) put(Fp8State::kHead, size_t(L) * Fp8State::kPerLayer, false);
    for (int l : s->moe()) put(l, fp8_expert_row(shape, l), true);
  }
  MPI_Allreduce(MPI_IN_PLACE, table.data(), int(table.size()), MPI_FLOAT, MPI_MAX, world);
  state.fp8_history = H;
  state.fp8_amax = std::move(table);
}

// The table back into this rank's chunks: the newest min(saved, fp8_amax_history) entries of each
// row (the deck may change the history's length). A checkpoint without FP8 state (an fp32 run
// going on in fp8) leaves the histories empty: the next step starts them as a first step does.
void restore_fp8(TrainEngine& engine, const Config& cfg, const ModelShape& shape,
                 const TrainState& state) {
  const int Hs = state.fp8_history, L = cfg.model.n_layer;
  for (Fp8State* s : engine.fp8_states()) {
    auto get = [&](int layer, size_t row, bool experts) {
      const int rows = s->rows(layer, experts);
      std::vector<float> h(size_t(rows) * s->H(), -1.0f);
      if (!state.fp8_amax.empty())
        for (int r = 0; r < rows; ++r)
          for (int k = 0; k < std::min(Hs, s->H()); ++k)
            h[size_t(r) * s->H() + k] = state.fp8_amax[(row + r) * Hs + k];
      s->set_history(layer, h, experts);
    };
    for (int l = s->begin(); l < s->end(); ++l) get(l, size_t(l) * Fp8State::kPerLayer, false);
    if (s->head()) get(Fp8State::kHead, size_t(L) * Fp8State::kPerLayer, false);
    for (int l : s->moe()) get(l, fp8_expert_row(shape, l), true);
  }
}

// model.moe.bias_rate: the MoE layers' selection biases of this rank's chunks into the
// layout-free TrainState::moe_bias, gathered over the world as a max (the ranks holding a layer
// hold the same bias; the others the lowest float). Collective; nothing without the bias.
void gather_moe_bias(TrainEngine& engine, MPI_Comm world, const Config& cfg, TrainState& state) {
  state.moe_bias.clear();
  if (cfg.model.moe.experts == 0 || cfg.model.moe.bias_rate <= 0) return;
  state.moe_bias = engine.moe_bias();
  MPI_Allreduce(MPI_IN_PLACE, state.moe_bias.data(), int(state.moe_bias.size()), MPI_FLOAT,
                MPI_MAX, world);
}

// The checkpoint's biases back into this rank's chunks; a checkpoint without them (a run
// without the bias going on with one) starts them at zero.
void restore_moe_bias(TrainEngine& engine, const Config& cfg, const TrainState& state) {
  if (cfg.model.moe.experts == 0 || cfg.model.moe.bias_rate <= 0) return;
  engine.set_moe_bias(state.moe_bias);
}

// The engine's optimizer state as checkpoint buffers over `host` (one per declared tensor; sized
// for the state layout where `size`).
ModelBuffers state_buffers(TrainEngine& engine, float* params,
                           std::vector<std::vector<float>>& host, bool size) {
  const std::vector<StateSpec>& specs = engine.optim_state();
  host.resize(specs.size());
  std::vector<StateBuffer> state;
  for (size_t k = 0; k < specs.size(); ++k) {
    if (size)
      host[k].assign(
          state_host_layout(specs[k], engine.state_layout(), engine.state_size()).total, 0.0f);
    state.push_back({specs[k], host[k].data()});
  }
  return {params, engine.optim_rule(), state};
}

// The weights of checkpoint `path`, and its optimizer state where the deck's rule can take it,
// into the engine (collective). Where it cannot and optim.reset_state allows, the rule's state
// starts afresh from the checkpoint's step: *fresh says so.
CheckpointInfo read_into(TrainEngine& engine, const Config& cfg, MPI_Comm comm, bool writer,
                         const std::string& path, bool* fresh) {
  *fresh = cfg.optim.reset_state &&
           !optimizer_state_problem(read_checkpoint_info(path), engine.optim_rule(),
                                    engine.optim_state())
                .empty();
  std::vector<std::vector<float>> host;
  const ModelBuffers buffers = *fresh ? ModelBuffers(engine.host_params())
                                      : state_buffers(engine, engine.host_params(), host, true);
  const CheckpointInfo info = read_checkpoint(comm, path, engine.state_layout(), writer, buffers,
                                              cfg.checkpoint.collective_bytes);
  if (*fresh) state_buffers(engine, nullptr, host, true);  // all zero: a fresh state
  engine.set_optim_state(host);
  engine.set_optim_first_step(*fresh ? long(info.state.step)
                                     : long(info.state.step - info.state.optim_step));
  return info;
}

}  // namespace

// A bad checkpoint is refused before anything is printed.
void Run::restore() {
  state_.seed = cfg_.train.seed;
  float* params = engine_->host_params();  // fp32, host: initialised or read here
  const auto t_read = Clock::now();
  if (!init_from_.empty()) {
    const Heartbeat beat(world_rank_ == 0, "init: reading " + init_from_);
    init_info_ = read_checkpoint(world_comm_, init_from_, engine_->state_layout(), writer_,
                                 {params, nullptr, nullptr}, cfg_.checkpoint.collective_bytes);
  }
  if (!restart_from_.empty()) {
    const Heartbeat beat(world_rank_ == 0, "restart: reading " + restart_from_);
    bool fresh = false;
    const CheckpointInfo info =
        read_into(*engine_, cfg_, world_comm_, writer_, restart_from_, &fresh);
    if (fresh && world_rank_ == 0)
      std::printf("restart: %s's optimizer state (%s) not taken (optim.reset_state): %s starts "
                  "afresh at step %lld\n",
                  restart_from_.c_str(), info.optim_rule.c_str(), engine_->optim_rule().c_str(),
                  (long long)info.state.step);
    state_ = info.state;
    restore_fp8(*engine_, cfg_, shape_, state_);
    restore_moe_bias(*engine_, cfg_, state_);
    restored_layout_ = info.saved_layout;
    train_data_->reseed(state_.seed);
    stop_point("reading the checkpoint");
  }
  read_seconds_ = seconds_since(t_read);
  if (restart_from_.empty() && init_from_.empty()) {
    const auto t0 = Clock::now();
    init_local_parameters(params, engine_->state_layout(), cfg_.train.seed,
                          cfg_.model.init_std);
    init_seconds_ = seconds_since(t0);
  }
  engine_->params_to_device();
}

// The snapshot's memory taken and touched now: first-touching 1.5 GB (GPT-2 124M) inside the
// first checkpoint's stall cost more than the copy itself.
void Run::start_background_writer() {
  int thread_level = 0;
  MPI_Query_thread(&thread_level);
  if (cfg_.checkpoint.async && thread_level >= MPI_THREAD_MULTIPLE) {
    background_ = std::make_unique<AsyncWriter>(world_comm_);
    background_->params.assign(engine_->state_size(), 0.0f);
    state_buffers(*engine_, nullptr, background_->state, true);
  } else if (cfg_.checkpoint.async) {
    log_->say("%s", "warning: checkpoint.async needs MPI_THREAD_MULTIPLE, which this MPI library "
                    "does not give: checkpoints are written synchronously");
  }
}

void Run::finish_write() {
  if (!background_ || !background_->busy()) return;
  const Heartbeat beat(world_rank_ == 0, "checkpoint: waiting for the background write");
  for (const std::string& line : background_->wait(&last_write_seconds_))
    log_->say("%s", line.c_str());
}

// checkpoint.keep: the older complete checkpoints go once a newer one is complete.
// Collective over comm; returns the lines for the log.
std::vector<std::string> Run::prune(MPI_Comm comm) {
  std::vector<std::string> lines;
  if (cfg_.checkpoint.keep <= 0) return lines;
  std::string why;
  if (world_rank_ == 0) try {
      for (const std::string& name : prune_checkpoints(ckpt_dir_, cfg_.checkpoint.keep))
        lines.push_back("checkpoint: removed " + name + " (checkpoint.keep = " +
                        std::to_string(cfg_.checkpoint.keep) + ")");
    } catch (const UserError& e) {
      why = e.what();
    }
  if (why = agree_on_failure(comm, why); !why.empty()) throw UserError(why, kExitIO);
  return lines;
}

void Run::save() {
  trace::set_phase("checkpoint write");
  const auto t0 = Clock::now();
  state_.data_sources = train_data_->describe();
  state_.data_position = train_data_->position(uint64_t(state_.next_sample));
  gather_fp8(*engine_, world_comm_, cfg_, shape_, state_);
  gather_moe_bias(*engine_, world_comm_, cfg_, state_);
  state_.optim_step = state_.step - engine_->optim_first_step();
  if (background_) {
    // A second checkpoint waits for the first; then the snapshot, and training goes on.
    finish_write();
    const float* p = engine_->params_to_host();
    background_->params.assign(p, p + engine_->state_size());
    engine_->get_optim_state(background_->state);
    const TrainState snapshot = state_;
    AsyncWriter* w = background_.get();
    background_->start([this, w, snapshot](MPI_Comm comm) {
      const auto t_write = Clock::now();
      const std::string path = write_checkpoint(
          comm, ckpt_dir_, engine_->state_layout(), writer_,
          state_buffers(*engine_, w->params.data(), w->state, false), snapshot, deck_yaml_,
          tokenizer(), layout_name(run_.layout), cfg_.checkpoint.collective_bytes,
          cfg_.checkpoint.reserve);
      std::error_code size_ec;
      std::vector<std::string> lines = {
          "checkpoint: wrote " + path + " (" +
          fmt("%.1f", world_rank_ == 0 ? fs::file_size(path, size_ec) / 1e6 : 0.0) + " MB) in " +
          fmt("%.2f", seconds_since(t_write)) + " s in the background"};
      for (std::string& line : prune(comm)) lines.push_back(std::move(line));
      return lines;
    });
    const double stall = seconds_since(t0);
    log_->say("checkpoint: step %lld copied to the host in %.3f s (training stalled %.3f s); "
              "writing in the background", (long long)state_.step, stall, stall);
    return;
  }
  const Heartbeat beat(world_rank_ == 0, "checkpoint: writing step " +
                                             std::to_string(state_.step) + " to " + ckpt_dir_);
  std::vector<std::vector<float>> host;
  engine_->get_optim_state(host);
  float* saved = engine_->params_to_host();
  const std::string path =
      write_checkpoint(world_comm_, ckpt_dir_, engine_->state_layout(), writer_,
                       state_buffers(*engine_, saved, host, false), state_, deck_yaml_,
                       tokenizer(), layout_name(run_.layout), cfg_.checkpoint.collective_bytes,
                       cfg_.checkpoint.reserve);
  std::error_code ec;
  log_->say("checkpoint: wrote %s (%.1f MB) in %.2f s", path.c_str(),
            world_rank_ == 0 ? fs::file_size(path, ec) / 1e6 : 0.0, seconds_since(t0));
  for (const std::string& line : prune(world_comm_)) log_->say("%s", line.c_str());
}

std::string Run::kept_checkpoint() {
  // checkpoint.async: the previous checkpoint may be in its background write; it is kept once
  // that completes, so wait for it before naming the newest.
  finish_write();
  const std::string newest = resolve_checkpoint(ckpt_dir_);
  return newest.empty() ? std::string("no checkpoint to keep")
                        : "kept " + fs::path(newest).filename().string();
}

// Rollback: the weights, moments and step of the newest complete checkpoint; the data goes on
// after the anomalous batch, so that the batches between (PaLM's remedy for a spike) are skipped.
// Returns the checkpoint's path ("" when there is none), step and data position.
AnomalyPolicy::Rolled Run::rollback() {
  finish_write();
  const std::string path = resolve_checkpoint(ckpt_dir_);
  if (path.empty()) return {};
  const Heartbeat beat(world_rank_ == 0, "rollback: reading " + path);
  bool fresh = false;
  const CheckpointInfo info = read_into(*engine_, cfg_, world_comm_, writer_, path, &fresh);
  engine_->params_to_device();
  restore_fp8(*engine_, cfg_, shape_, info.state);
  restore_moe_bias(*engine_, cfg_, info.state);
  const int64_t next = state_.next_sample;
  state_ = info.state;
  state_.next_sample = next;
  last_saved_ = -1;  // the data position differs from the checkpoint's: a stop writes anew
  return {path, info.state.step, info.state.next_sample};
}

}  // namespace tessera
