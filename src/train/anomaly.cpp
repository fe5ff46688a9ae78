#include "train/anomaly.hpp"

#include <cmath>
#include <cstdio>

namespace tessera {

namespace {

std::string not_finite(const char* name, double value) {
  return std::string(name) + " " + (std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf") +
         " is not finite";
}

}  // namespace

std::string AnomalyDetector::spike(const char* name, double value,
                                   const std::deque<double>& past) const {
  // Only a full window says what normal is: the first steps of a run fall fast.
  if (sigma_ <= 0 || past.size() < size_t(window_)) return "";
  double mean = 0, var = 0;
  for (double x : past) mean += x;
  mean /= double(past.size());
  for (double x : past) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(past.size()));
  if (value <= mean + sigma_ * sd) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %.6g is above the mean %.6g + %g x std %.6g of the last %d steps",
                name, value, mean, sigma_, sd, window_);
  return buf;
}

std::string AnomalyDetector::judge(double loss, double norm, double fp8_amax) const {
  if (!std::isfinite(loss)) return not_finite("loss", loss);
  if (!std::isfinite(norm)) return not_finite("grad_norm", norm);
  if (!std::isfinite(fp8_amax)) return not_finite("fp8 amax", fp8_amax);
  if (std::string why = spike("loss", loss, losses_); !why.empty()) return why;
  return spike("grad_norm", norm, norms_);
}

void AnomalyDetector::accept(double loss, double norm) {
  losses_.push_back(loss);
  norms_.push_back(norm);
  if (losses_.size() > size_t(window_)) {
    losses_.pop_front();
    norms_.pop_front();
  }
}

}  // namespace tessera
