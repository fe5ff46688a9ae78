#include "train/telemetry.hpp"

#include <algorithm>

namespace tessera {

std::vector<std::pair<std::string, double>> StepBreakdown::ms_per_step() const {
  if (steps == 0) return {};
  const op_clock::Waits waits = {tp, dp, cp, ep, pp, embed, data};
  double sum = 0;
  for (double s : ops) sum += s;
  for (double s : waits) sum += s;
  return op_clock::rows(ops, waits, std::max(0.0, step - sum), step, 1e3 / double(steps));
}

void StepTelemetry::before_step(const TrainEngine& engine) { before_ = engine.counters(); }

void StepTelemetry::after_step(const TrainEngine& engine) {
  const TrainEngine::Counters now = engine.counters();
  bytes_ += now.payload - before_.payload;
  for (StepBreakdown* b : {&interval_, &run_}) {
    if (b == &run_ && measured_steps_ == 0) continue;  // the first step warms up
    for (size_t k = 0; k < now.ops.size(); ++k) b->ops[k] += now.ops[k] - before_.ops[k];
    b->tp += now.tp_wait - before_.tp_wait;
    b->dp += now.dp_wait - before_.dp_wait;
    b->cp += now.cp_wait - before_.cp_wait;
    b->ep += now.ep_wait - before_.ep_wait;
    b->embed += now.embed_wait - before_.embed_wait;
    b->pp += now.pipeline_wait;
    ++b->steps;
  }
  if (measured_steps_++ == 0) return;
  wait_ += now.pipeline_wait;
  run_seconds_ += now.pipeline_run;
  dp_wait_ += now.dp_wait - before_.dp_wait;
  cp_wait_ += now.cp_wait - before_.cp_wait;
  cp_attention_ += now.cp_attention - before_.cp_attention;
}

// The loader's wait comes before its step's after_step, the step's wall time after it.
void StepTelemetry::add_data_wait(double seconds) {
  data_wait_ += seconds;
  interval_.data += seconds;
  if (measured_steps_ > 0) run_.data += seconds;
}

void StepTelemetry::add_step_seconds(double seconds) {
  interval_seconds_ += seconds;
  interval_.step += seconds;
  if (measured_steps_ > 1) run_.step += seconds;
}

double StepTelemetry::take_data_wait_fraction() {
  const double fraction = interval_seconds_ > 0 ? data_wait_ / interval_seconds_ : 0;
  data_wait_ = interval_seconds_ = 0;
  return fraction;
}

StepBreakdown StepTelemetry::take_interval_breakdown() {
  StepBreakdown b = interval_;
  interval_ = StepBreakdown{};
  return b;
}

std::vector<std::pair<std::string, double>> StepTelemetry::per_step() const {
  const double steps = double(std::max(1L, measured_steps_));
  const double after_first = double(std::max(1L, measured_steps_ - 1));
  std::vector<std::pair<std::string, double>> out = {
      {"pipeline_bubble", run_seconds_ > 0 ? wait_ / run_seconds_ : 0.0},
      {"dp_wait_s_per_step", dp_wait_ / after_first},
      {"cp_wait_s_per_step", cp_wait_ / after_first},
      {"cp_attention_s_per_step", cp_attention_ / after_first}};
  for (int k = 0; k < kTraffic; ++k)
    out.emplace_back(std::string(kTrafficNames[k]) + "_bytes_per_step", bytes_.bytes[k] / steps);
  return out;
}

}  // namespace tessera
