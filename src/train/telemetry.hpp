#pragma once
// What a run measures of its steps, for the per-step log line and the per-rank lines at its end:
// the loader's wait over each log interval, and over the steps after the first (which warms up)
// the pipeline's blocked and total seconds, the exposed data- and context-parallel waits; each
// group's payload bytes over every step (the planner's counts, parallel/traffic.hpp); and where a
// step's time goes (the breakdown: each kind of op, backend/op_clock.hpp, each communicator's
// waits, the loader's, the rest), over each log interval and over the run.
#include <string>
#include <utility>
#include <vector>

#include "backend/op_clock.hpp"
#include "engine/engine.hpp"
#include "parallel/traffic.hpp"

namespace tessera {

// Seconds summed over some steps: in each op slot, blocked on each group, waiting for data, and
// the steps' wall time.
struct StepBreakdown {
  op_clock::Seconds ops{};
  double tp = 0, dp = 0, cp = 0, ep = 0, pp = 0, embed = 0, data = 0, step = 0;
  long steps = 0;
  // (name, ms a step): the op slots, the waits ("tp_wait"...), "other" (the step's rest: host
  // work between ops, launches), "step"; empty without steps.
  std::vector<std::pair<std::string, double>> ms_per_step() const;
};

class StepTelemetry {
 public:
  // Around each engine step (TrainEngine::train_step): the engine's counters before and after.
  void before_step(const TrainEngine& engine);
  void after_step(const TrainEngine& engine);
  long measured_steps() const { return measured_steps_; }

  // The log interval: the loader's wait and the steps' wall time, and the wait's fraction of it
  // (rank 0's: a first-stage rank, it reads tokens), which starts a new interval.
  void add_data_wait(double seconds);
  void add_step_seconds(double seconds);
  double take_data_wait_fraction();
  // The interval's breakdown, which starts a new one; the run's, its steps after the first.
  StepBreakdown take_interval_breakdown();
  const StepBreakdown& run_breakdown() const { return run_; }

  // Per step: each group's payload ("tp_bytes_per_step"...), the pipeline's bubble, the waits
  // ("dp_wait_s_per_step", "cp_wait_s_per_step", "cp_attention_s_per_step").
  std::vector<std::pair<std::string, double>> per_step() const;

 private:
  TrainEngine::Counters before_;
  TrafficBytes bytes_;
  double wait_ = 0, run_seconds_ = 0, dp_wait_ = 0, cp_wait_ = 0, cp_attention_ = 0;
  long measured_steps_ = 0;
  double data_wait_ = 0, interval_seconds_ = 0;
  StepBreakdown interval_, run_;
};

}  // namespace tessera
