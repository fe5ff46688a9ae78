#pragma once
// One `tessera train` run on this rank: everything the deck, the data and the world size make of
// it, built once, bottom-up, by the constructor (train/startup.cpp), then walked by train()
// (train/trainer.cpp): restore, announce, the step loop, finish. Its parts live in files named
// for them: the set-up and its checks (startup.cpp), checkpoints written, read and rolled back to
// (checkpointing.cpp), the start-up and per-step log (report.cpp), the step loop with its
// cadence of evaluations and checkpoints and the anomaly policy (step_loop.cpp).
//
// Members are declared in the order they are made, so that they go in the reverse order: the
// loader and the background writer before the engine, the engine before the communicators, the
// run directory's locks after the last line of the log.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "device/select.hpp"
#include "engine/engine.hpp"
#include "engine/memory.hpp"
#include "engine/run_layout.hpp"
#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "io/prefetch.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/comm.hpp"
#include "parallel/layout.hpp"
#include "parallel/mesh.hpp"
#include "parallel/traffic.hpp"
#include "train/anomaly_policy.hpp"
#include "train/async_writer.hpp"
#include "train/faults.hpp"
#include "train/run_dir.hpp"
#include "train/run_log.hpp"
#include "train/telemetry.hpp"
#include "train/watchdog.hpp"

namespace tessera {

using Clock = std::chrono::steady_clock;

// Why a run stops before train.steps, agreed by all ranks (the larger wins).
enum Stop { kNone, kBudget, kSigint, kSigterm, kSigusr1 };
const char* stop_why(int stop);
// The stop a signal received so far asks for (kNone without one), and the exit status of a stop.
int signalled_stop();
int stop_status(int stop);

class Run {
 public:
  // The set-up: the device, the data, the model's shape and layout, the checkpoint to start
  // from, the engine's declarations against the node's memory, the run directory, the token scan,
  // then the one allocation. Every check comes before anything is allocated or written; a stop
  // signal meanwhile ends the job at once (UserError with the requeue status).
  Run(MPI_Comm world, const Config& cfg);

  // The parameters: fresh from the seed, from checkpoint.init_from, or with the optimizer state
  // and the data position from the restart checkpoint (checkpointing.cpp).
  void restore();
  // The start-up log: model, layout, ranks, memory, data, restart; the peak MFU is measured
  // against (report.cpp). Runs after restore(), which it reports.
  void announce();
  // Steps until train.steps (step_loop.cpp): the exit status of a run that stopped before (a
  // signal, the wall-time budget, the anomaly policy), nothing when it went the whole way.
  std::optional<int> loop();
  // The last checkpoint, the per-rank statistics, "done", exit_status (step_loop.cpp).
  int finish();

 private:
  // --- set-up (startup.cpp) ---
  void open_data();
  void lay_out();
  void find_checkpoints();
  void declare_engine();
  void open_run_dir();
  void scan_tokens();
  // A stop signal before the first step ends the job at once, with its status.
  void stop_point(const char* during);
  // <run.dir>/exit_status, agreed on by every rank; returns status.
  int write_exit_status(int status);
  const TokenizerInfo& tokenizer() const { return train_data_->sources().front().tokenizer(); }

  // --- checkpoints (checkpointing.cpp) ---
  void start_background_writer();
  void save();
  void finish_write();
  std::vector<std::string> prune(MPI_Comm comm);
  AnomalyPolicy::Rolled rollback();
  std::string kept_checkpoint();

  // --- the log (report.cpp) ---
  void announce_model();
  void announce_data();
  void announce_start();
  void measure_peak();
  void log_step(double seconds, double loss, double norm);
  struct MoeReport {
    std::string line;             // the step line's MoE part ("" if dense)
    JsonRow json = JsonRow::object();  // metrics.jsonl's MoE keys (none if dense)
  };
  MoeReport moe_report() const;
  void log_ranks();
  void log_breakdown();

  // --- the step loop (step_loop.cpp) ---
  void start_loop();
  int step_boundary();
  void read_step();
  void take_step(double* loss, double* norm, std::string* anomaly);
  std::optional<int> meet_anomaly(const std::string& anomaly, double loss, double norm);
  void after_step();
  void evaluate();
  double val_bytes(uint64_t windows);

  MPI_Comm world_comm_;
  const Config& cfg_;
  int world_rank_ = 0, world_size_ = 1;
  device::DeviceChoice backend_;
  Clock::time_point t_start_;
  const int T_, B_;

  // The data, the model and its layout on this rank.
  std::unique_ptr<Dataset> train_data_;
  std::unique_ptr<TokenSource> val_data_;
  int vocab_ = 0;
  ModelShape shape_;
  RunLayout run_;
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<Comm> world_;
  LocalLayout tile_;
  std::vector<Action> schedule_;
  bool reads_tokens_ = false;
  bool writer_ = false;      // one rank of each data-parallel group writes its tile
  bool speaks_loss_ = false;  // one copy of each dp group's loss

  // Where the run starts from and writes to.
  std::string ckpt_dir_, restart_from_, init_from_;
  std::unique_ptr<TrainEngine> engine_;
  RankMemory planned_;
  std::string deck_yaml_;
  std::unique_ptr<RunDirs> dirs_;
  std::unique_ptr<RunLog> log_;
  uint64_t checked_tokens_ = 0;
  uint32_t max_id_ = 0;
  double check_seconds_ = 0;

  // The state a checkpoint carries, and what start-up read.
  TrainState state_;
  std::string restored_layout_;
  CheckpointInfo init_info_;
  double read_seconds_ = 0, init_seconds_ = 0;
  double peak_gflops_ = 0, flops_token_ = 0;
  // The last step's MoE routing over every rank (TrainEngine::take_moe_stats' layout), summed
  // once per dp rank and stage (the tp and cp ranks' copies left out); empty for a dense model.
  std::vector<double> moe_stats_;
  LrSchedule schedule_lr_;

  // checkpoint.async (train/async_writer.hpp): the write in flight is waited for, at the same
  // point on every rank, before the next checkpoint, a rollback, a stop and the end.
  std::unique_ptr<AsyncWriter> background_;
  double last_write_seconds_ = 0;

  // The step loop's own: what it measures (train/telemetry.hpp), how it meets an anomalous step
  // (train/anomaly_policy.hpp), the faults a test planted (train/faults.hpp).
  StepTelemetry telemetry_;
  AnomalyPolicy anomaly_;
  FaultInjection faults_;
  double last_step_seconds_ = 0, last_save_seconds_ = 0;
  std::string trace_failure_;
  long last_saved_ = -1;
  std::vector<HostMicroBatch> views_;
  std::unique_ptr<Prefetcher> loader_;
  AppendFile trace_;
  Clock::time_point t_loop_;
  int64_t first_step_ = 0;
  bool loader_logged_ = false;
  float dloss_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
  bool hang_warned_ = false;
  // Bytes of text the evaluated validation targets stand for (val_bpb's denominator); -1 when
  // the tokenizer cannot say (data recording none).
  double val_bytes_ = 0;
  uint64_t val_bytes_windows_ = 0;
};

}  // namespace tessera
