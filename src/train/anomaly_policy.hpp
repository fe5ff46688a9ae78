#pragma once
// The anomaly policy of a run (train.anomaly_*; docs/checkpoints.md, "Long runs"): its detector judges each
// step before the update; an anomalous one is met by the deck's action (skip the batch, roll
// back to the newest checkpoint, or stop), more than kAnomaliesInARow in a row stop the run, and
// rollbacks are bounded by train.anomaly_max_rollbacks (per checkpoint, and 5 x that in all).
// The policy decides and keeps count; the run reads the checkpoint and logs (step_loop.cpp).
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "config/config.hpp"
#include "train/anomaly.hpp"

namespace tessera {

class AnomalyPolicy {
 public:
  explicit AnomalyPolicy(const TrainConfig& train);

  // The step's verdict: "" when normal (AnomalyDetector::judge).
  std::string judge(double loss, double norm, double fp8_amax) const {
    return detector_.judge(loss, norm, fp8_amax);
  }
  // A step whose update was applied: it joins the windows and ends a run of anomalies.
  void accept(double loss, double norm);

  // What a rollback found: the checkpoint's path ("" with none), its step, and the global sample
  // its data position was at.
  struct Rolled {
    std::string path;
    int64_t step = 0, from = 0;
  };
  // How an anomalous step was met: the log's text, the action taken ("skip", "rollback",
  // "stop"), and the exit status (kExitAnomaly when the run stops, else 0).
  struct Outcome {
    std::string text;
    const char* action = "stop";
    int status = 0;
  };
  // The step consumed global samples [from, to) and its update was dropped. roll_back reads
  // the newest checkpoint of ckpt_dir (the rollback action, when the bounds allow one).
  Outcome meet(int64_t from, int64_t to, const std::string& ckpt_dir,
               const std::function<Rolled()>& roll_back);

  int rollbacks() const { return rollbacks_; }
  int64_t skipped_samples() const { return skipped_samples_; }

 private:
  AnomalyDetector detector_;
  AnomalyAction action_;
  int max_rollbacks_;
  int in_a_row_ = 0;
  std::map<std::string, int> rollbacks_to_;  // by checkpoint
  int rollbacks_ = 0;
  // The global samples rollbacks skipped, as disjoint [from, to) ranges (rollbacks to the same
  // checkpoint skip overlapping ranges: each sample is counted once), and their total.
  std::map<int64_t, int64_t> skipped_;
  int64_t skipped_samples_ = 0;
  void skip(int64_t from, int64_t to);
};

}  // namespace tessera
