#pragma once
// The faults the test suites plant in a run, read once at start-up from the environment: the one
// place production code looks at them (tests/integration/test_anomaly.sh, test_hang.sh, the chaos
// soak set them; nothing else does).
//   TESSERA_TEST_NAN_STEP=N    step N's loss gradient becomes NaN (once per job: a rollback
//                              replays step numbers)
//   TESSERA_TEST_SPIKE_STEP=N  step N's loss gradient is multiplied by 10^4 (once per job)
//   TESSERA_TEST_STALL=R:N     world rank R stalls for ever at the start of step N
namespace tessera {

class FaultInjection {
 public:
  static FaultInjection from_environment();

  // The loss gradient step `step` (1-based) runs with: dloss, or the planted fault's, once.
  float step_dloss(long step, float dloss);
  // Whether world rank `rank` stalls at the start of step `step` (1-based).
  bool stalls(long rank, long step) const { return rank == stall_rank_ && step == stall_step_; }

 private:
  long nan_step_ = -1, spike_step_ = -1, stall_rank_ = -1, stall_step_ = -1;
};

}  // namespace tessera
