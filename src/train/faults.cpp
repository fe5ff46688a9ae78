#include "train/faults.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tessera {

namespace {

long env_step(const char* var) {
  const char* v = std::getenv(var);
  return v ? std::atol(v) : -1L;
}

}  // namespace

FaultInjection FaultInjection::from_environment() {
  FaultInjection f;
  f.nan_step_ = env_step("TESSERA_TEST_NAN_STEP");
  f.spike_step_ = env_step("TESSERA_TEST_SPIKE_STEP");
  if (const char* v = std::getenv("TESSERA_TEST_STALL"))
    if (std::sscanf(v, "%ld:%ld", &f.stall_rank_, &f.stall_step_) != 2) f.stall_rank_ = -1;
  return f;
}

float FaultInjection::step_dloss(long step, float dloss) {
  if (step == nan_step_) dloss = NAN, nan_step_ = -1;
  if (step == spike_step_) dloss *= 1e4f, spike_step_ = -1;
  return dloss;
}

}  // namespace tessera
