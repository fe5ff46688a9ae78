#pragma once
// What a run tells its user: the console and <run.dir>/metrics.jsonl, written by world rank 0,
// and the small formatters of their lines (clock times, JSON numbers, the layout's name).
#include <chrono>
#include <cstdio>
#include <string>

#include "common/files.hpp"
#include "io/json.hpp"
#include "parallel/layout.hpp"

namespace tessera {

// Console and metrics.jsonl, world rank 0 only. A write of metrics.jsonl that fails (a full
// disk) is kept as failure() until the ranks next agree on failures, so that all stop together.
class RunLog {
 public:
  RunLog(bool active, const std::string& run_dir);
  template <typename... Args>
  void say(const char* fmt, Args... args) {
    if (!active_) return;
    std::printf(fmt, args...);
    std::printf("\n");
    std::fflush(stdout);
  }
  void json(const JsonRow& row);
  const std::string& failure() const { return failure_; }

 private:
  bool active_;
  AppendFile metrics_;
  std::string failure_;
};

double seconds_since(std::chrono::steady_clock::time_point t);
// printf of one number.
std::string fmt(const char* f, double v);
// "m:ss", or "h:mm:ss" from an hour on.
std::string clock_time(double seconds);
// A number in metrics.jsonl as printf writes it with `f` ("%.3f": milliseconds to the
// microsecond), so the row stays short; NaN and infinity stay as they are (written as null).
double printed(const char* f, double v);
// "dp=2,tp=2,pp=2" ("dp=2,cp=2,tp=2,pp=2" with cp > 1): the layout as the log and a
// checkpoint's saved_layout name it.
std::string layout_name(const ParallelLayout& l);

}  // namespace tessera
