#include "train/telemetry.hpp"

#include <algorithm>

namespace tessera {

void StepTelemetry::before_step(const TrainEngine& engine) { before_ = engine.counters(); }

void StepTelemetry::after_step(const TrainEngine& engine) {
  const TrainEngine::Counters now = engine.counters();
  bytes_ += now.payload - before_.payload;
  if (measured_steps_++ == 0) return;  // the first step warms up
  wait_ += now.pipeline_wait;
  run_ += now.pipeline_run;
  dp_wait_ += now.dp_wait - before_.dp_wait;
  cp_wait_ += now.cp_wait - before_.cp_wait;
  cp_attention_ += now.cp_attention - before_.cp_attention;
}

double StepTelemetry::take_data_wait_fraction() {
  const double fraction = interval_seconds_ > 0 ? data_wait_ / interval_seconds_ : 0;
  data_wait_ = interval_seconds_ = 0;
  return fraction;
}

std::vector<std::pair<std::string, double>> StepTelemetry::per_step() const {
  const double steps = double(std::max(1L, measured_steps_));
  const double after_first = double(std::max(1L, measured_steps_ - 1));
  std::vector<std::pair<std::string, double>> out = {
      {"pipeline_bubble", run_ > 0 ? wait_ / run_ : 0.0},
      {"dp_wait_s_per_step", dp_wait_ / after_first},
      {"cp_wait_s_per_step", cp_wait_ / after_first},
      {"cp_attention_s_per_step", cp_attention_ / after_first}};
  for (int k = 0; k < kTraffic; ++k)
    out.emplace_back(std::string(kTrafficNames[k]) + "_bytes_per_step", bytes_.bytes[k] / steps);
  return out;
}

}  // namespace tessera
