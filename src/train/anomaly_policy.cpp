#include "train/anomaly_policy.hpp"

#include <algorithm>
#include <filesystem>
#include <iterator>

#include "common/error.hpp"
#include "io/checkpoint.hpp"

namespace tessera {

namespace {

// More anomalous steps in a row than this is not a passing spike: the run stops.
constexpr int kAnomaliesInARow = 10;

}  // namespace

AnomalyPolicy::AnomalyPolicy(const TrainConfig& train)
    : detector_(train.anomaly_window, train.anomaly_sigma), action_(train.anomaly_action),
      max_rollbacks_(train.anomaly_max_rollbacks) {}

void AnomalyPolicy::accept(double loss, double norm) {
  in_a_row_ = 0;
  detector_.accept(loss, norm);
}

AnomalyPolicy::Outcome AnomalyPolicy::meet(int64_t from, int64_t to, const std::string& ckpt_dir,
                                           const std::function<Rolled()>& roll_back) {
  Outcome out;
  out.action = deck_word(action_);
  if (++in_a_row_ > kAnomaliesInARow) {
    out.text = "stop: " + std::to_string(in_a_row_) + " anomalous steps in a row";
    out.status = kExitAnomaly;
  } else if (action_ == AnomalyAction::Skip) {
    out.text = "skip: update dropped, global samples [" + std::to_string(from) + ", " +
               std::to_string(to) + ") skipped";
  } else if (action_ == AnomalyAction::Rollback) {
    // A cause that persists brings the run back to the same checkpoint again and again, each
    // time skipping more data: train.anomaly_max_rollbacks bounds that.
    const std::string newest = resolve_checkpoint(ckpt_dir);
    const int limit = max_rollbacks_;
    const std::string name = std::filesystem::path(newest).filename().string();
    if (!newest.empty() && (rollbacks_to_[newest] >= limit || rollbacks_ >= 5 * limit)) {
      out.text = "rollback: " +
                 (rollbacks_to_[newest] >= limit
                      ? std::to_string(rollbacks_to_[newest]) + " rollbacks to " + name + " already"
                      : std::to_string(rollbacks_) + " rollbacks in this job already") +
                 " (train.anomaly_max_rollbacks = " + std::to_string(limit) +
                 "), the cause persists: stop, " + std::to_string(skipped_samples_) +
                 " samples skipped by rollbacks";
      out.status = kExitAnomaly;
    } else if (const Rolled rolled = roll_back(); rolled.path.empty()) {
      out.text = "rollback: no checkpoint in " + ckpt_dir + " to roll back to: stop";
      out.status = kExitAnomaly;
    } else {
      ++rollbacks_to_[rolled.path];
      ++rollbacks_;
      skip(rolled.from, to);
      out.text = "rollback " + std::to_string(rollbacks_to_[rolled.path]) + " of " +
                 std::to_string(limit) + ": to " + rolled.path + " (step " +
                 std::to_string(rolled.step) + "), global samples [" +
                 std::to_string(rolled.from) + ", " + std::to_string(to) + ") skipped, " +
                 std::to_string(skipped_samples_) + " samples skipped by rollbacks in this job";
    }
  } else {
    out.text = "stop";
    out.status = kExitAnomaly;
  }
  if (out.status != 0) out.action = "stop";
  return out;
}

void AnomalyPolicy::skip(int64_t from, int64_t to) {
  // Merged with every range it touches, then the total recounted (a few ranges at most).
  auto it = skipped_.upper_bound(from);
  if (it != skipped_.begin() && std::prev(it)->second >= from) --it;
  while (it != skipped_.end() && it->first <= to) {
    from = std::min(from, it->first);
    to = std::max(to, it->second);
    it = skipped_.erase(it);
  }
  skipped_[from] = to;
  skipped_samples_ = 0;
  for (const auto& [a, b] : skipped_) skipped_samples_ += b - a;
}

}  // namespace tessera
