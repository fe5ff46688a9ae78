#pragma once
// The anomaly policy's detector (train.anomaly_*; docs/checkpoints.md, "Long runs"): a step whose loss or
// global gradient norm is not finite, or, with sigma > 0, lies above the running mean + sigma
// standard deviations of the last `window` accepted steps, is anomalous. Every rank judges the
// same reduced numbers, so every rank reaches the same verdict.
#include <deque>
#include <string>

namespace tessera {

class AnomalyDetector {
 public:
  AnomalyDetector(int window, double sigma) : window_(window), sigma_(sigma) {}
  // "" for a normal step, else what is wrong: "grad_norm nan is not finite", "loss 9.1 is above
  // the mean 4.2 + 3 x std 0.5 of the last 20 steps".
  // fp8_amax (device.precision fp8): the largest amax of the step's FP8 tensors, anomalous when
  // not finite ("fp8 amax inf is not finite"); 0 without FP8.
  std::string judge(double loss, double norm, double fp8_amax = 0) const;
  // A step whose update was applied joins the windows.
  void accept(double loss, double norm);

 private:
  std::string spike(const char* name, double value, const std::deque<double>& past) const;
  int window_;
  double sigma_;
  std::deque<double> losses_, norms_;
};

}  // namespace tessera
