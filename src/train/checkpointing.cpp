// A run's checkpoints (train/run.hpp): the start from one (restart, or the weights of
// checkpoint.init_from) or from the seed; writing one, synchronously or from a host snapshot by
// the background writer (checkpoint.async); checkpoint.keep's pruning; and the anomaly policy's
// rollback to the newest complete one.
#include <filesystem>

#include "common/error.hpp"
#include "model/shard.hpp"
#include "train/heartbeat.hpp"
#include "train/run.hpp"

namespace tessera {

namespace fs = std::filesystem;

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
    std::vector<float> m(engine_->state_size()), v(engine_->state_size());
    const CheckpointInfo info =
        read_checkpoint(world_comm_, restart_from_, engine_->state_layout(), writer_,
                        {params, m.data(), v.data()}, cfg_.checkpoint.collective_bytes);
    engine_->set_moments(m, v);
    state_ = info.state;
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
    for (std::vector<float>* b :
         {&background_->params, &background_->exp_avg, &background_->exp_avg_sq})
      b->assign(engine_->state_size(), 0.0f);
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
  if (background_) {
    // A second checkpoint waits for the first; then the snapshot, and training goes on.
    finish_write();
    const float* p = engine_->params_to_host();
    background_->params.assign(p, p + engine_->state_size());
    engine_->get_moments(background_->exp_avg, background_->exp_avg_sq);
    const TrainState snapshot = state_;
    AsyncWriter* w = background_.get();
    background_->start([this, w, snapshot](MPI_Comm comm) {
      const auto t_write = Clock::now();
      const std::string path = write_checkpoint(
          comm, ckpt_dir_, engine_->state_layout(), writer_,
          {w->params.data(), w->exp_avg.data(), w->exp_avg_sq.data()}, snapshot, deck_yaml_,
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
  std::vector<float> m, v;
  engine_->get_moments(m, v);
  float* saved = engine_->params_to_host();
  const std::string path =
      write_checkpoint(world_comm_, ckpt_dir_, engine_->state_layout(), writer_,
                       {saved, m.data(), v.data()}, state_, deck_yaml_, tokenizer(),
                       layout_name(run_.layout), cfg_.checkpoint.collective_bytes,
                       cfg_.checkpoint.reserve);
  std::error_code ec;
  log_->say("checkpoint: wrote %s (%.1f MB) in %.2f s", path.c_str(),
            world_rank_ == 0 ? fs::file_size(path, ec) / 1e6 : 0.0, seconds_since(t0));
  for (const std::string& line : prune(world_comm_)) log_->say("%s", line.c_str());
}

std::string Run::kept_checkpoint() const {
  const std::string newest = resolve_checkpoint(ckpt_dir_);
  return newest.empty() ? std::string("no checkpoint to keep")
                        : "kept " + fs::path(newest).filename().string();
}

// Rollback: the weights, moments and step of the newest complete checkpoint; the data goes on
// after the anomalous batch, so that the batches between (PaLM's remedy for a spike) are skipped.
// Returns the checkpoint's path, "" when there is none.
std::string Run::rollback() {
  finish_write();
  const std::string path = resolve_checkpoint(ckpt_dir_);
  if (path.empty()) return path;
  const Heartbeat beat(world_rank_ == 0, "rollback: reading " + path);
  std::vector<float> m(engine_->state_size()), v(engine_->state_size());
  const CheckpointInfo info =
      read_checkpoint(world_comm_, path, engine_->state_layout(), writer_,
                      {engine_->host_params(), m.data(), v.data()},
                      cfg_.checkpoint.collective_bytes);
  engine_->set_moments(m, v);
  engine_->params_to_device();
  const int64_t next = state_.next_sample;
  rolled_from_ = info.state.next_sample;
  state_ = info.state;
  state_.next_sample = next;
  last_saved_ = -1;  // the data position differs from the checkpoint's: a stop writes anew
  return path;
}

}  // namespace tessera
