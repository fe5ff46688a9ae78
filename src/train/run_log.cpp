#include "train/run_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace tessera {

RunLog::RunLog(bool active, const std::string& run_dir) : active_(active) {
  if (active_)
    failure_ = metrics_.open((std::filesystem::path(run_dir) / "metrics.jsonl").string());
}

void RunLog::json(const JsonRow& row) {
  if (active_ && failure_.empty()) failure_ = metrics_.append(json_text(row) + "\n");
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string clock_time(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

double printed(const char* f, double v) {
  return std::isfinite(v) ? std::strtod(fmt(f, v).c_str(), nullptr) : v;
}

std::string layout_name(const ParallelLayout& l) {
  return "dp=" + std::to_string(l.dp) + (l.cp > 1 ? ",cp=" + std::to_string(l.cp) : "") +
         ",tp=" + std::to_string(l.tp) + ",pp=" + std::to_string(l.pp);
}

}  // namespace tessera
