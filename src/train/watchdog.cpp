#include "train/watchdog.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/error.hpp"
#include "common/files.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// What one rank's file says on its first two lines.
struct RankState {
  bool reported = false;
  long step = 0;
  bool in_call = false;
  std::string phase, call;
};

RankState read_state(const std::string& path) {
  RankState s;
  std::ifstream in(path);
  std::string line1, line2, line3;
  if (!std::getline(in, line1) || !std::getline(in, line2) || !std::getline(in, line3)) return s;
  int in_call = 0;
  if (std::sscanf(line1.c_str(), "step=%ld in_call=%d", &s.step, &in_call) != 2) return s;
  s.reported = true;
  s.in_call = in_call != 0;
  s.phase = line2.substr(line2.find('=') + 1);
  s.call = line3.substr(line3.find('=') + 1);
  return s;
}

// "rank 3" or "ranks 0, 2, 5" (at most 8 named).
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) out += " and " + std::to_string(ranks.size() - 8) + " more";
  return out;
}

}  // namespace

Watchdog::Watchdog(const std::string& run_dir, int rank, int size, double timeout)
    : dir_((fs::path(run_dir) / "hang").string()), rank_(rank), size_(size), timeout_(timeout) {
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool Watchdog::wait_for(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !wake_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stop_; });
}

void Watchdog::watch() {
  uint64_t seen = trace::progress();
  double since = trace::now();
  while (wait_for(std::min(0.25, timeout_ / 4))) {
    const uint64_t p = trace::progress();
    const double t = trace::now();
    if (p != seen) {
      seen = p;
      since = t;
    } else if (t - since >= timeout_) {
      hang(t - since);
      return;
    }
  }
}

void Watchdog::hang(double idle) {
  std::string call;
  const bool in_call = trace::in_call(&call);
  const std::string report = trace::report(trace::now());
  // Lines 1-3 are read back by rank 0; the step is the first line of the report.
  long step = 0;
  std::sscanf(report.c_str(), "step %ld", &step);
  const std::string phase = report.substr(report.find("phase ") + 6,
                                          report.find('\n') - report.find("phase ") - 6);
  const std::string text = "step=" + std::to_string(step) + " in_call=" + (in_call ? "1" : "0") +
                           "\nphase=" + phase + "\ncall=" + (in_call ? call : "none") +
                           "\nrank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                           ": no progress for " + std::to_string(idle) + " s\n" + report;
  const std::string path = (fs::path(dir_) / ("rank_" + std::to_string(rank_) + ".txt")).string();
  std::string why = make_directories(dir_);
  if (why.empty()) why = write_file_atomically(path, text, /*durable=*/false);
  if (rank_ != 0) {
    // Rank 0 ends the job; should it be gone too, this rank does, a little later.
    if (wait_for(timeout_ + 30)) {
      std::fprintf(stderr, "rank %d: hang: no progress for %.0f s and rank 0 did not end the job%s\n",
                   rank_, idle + timeout_ + 30, why.empty() ? "" : ("; " + why).c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, kExitHang);
    }
    return;
  }
  // Rank 0: every rank's file (the others see the same silence within a poll or two).
  std::vector<RankState> states(static_cast<size_t>(size_));
  for (int tries = 0; tries < 40; ++tries) {
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      RankState& s = states[size_t(r)];
      if (!s.reported) s = read_state((fs::path(dir_) / ("rank_" + std::to_string(r) + ".txt")).string());
      all = all && s.reported;
    }
    if (all || !wait_for(0.25)) break;
  }
  // Behind: the ranks outside any communication call (computing, stalled) while others wait in
  // one; when every rank waits in a call, those at the lowest step.
  std::vector<int> behind, waiting, silent;
  long lowest = -1;
  for (int r = 0; r < size_; ++r) {
    const RankState& s = states[size_t(r)];
    if (!s.reported) silent.push_back(r);
    else if (!s.in_call) behind.push_back(r);
    else waiting.push_back(r);
    if (s.reported && (lowest < 0 || s.step < lowest)) lowest = s.step;
  }
  if (behind.empty())
    for (int r : waiting)
      if (states[size_t(r)].step == lowest) behind.push_back(r);
  std::string line = "hang: no progress for " + std::to_string(long(idle)) +
                     " s (run.hang_timeout): ";
  if (!behind.empty()) {
    const RankState& b = states[size_t(behind.front())];
    line += rank_list(behind) + (behind.size() == 1 ? " is" : " are") + " behind at step " +
            std::to_string(b.step) + " (" +
            (b.in_call ? "in " + b.call : "in no communication call, phase " + b.phase) + ")";
  }
  std::vector<int> others;
  for (int r : waiting)
    if (std::find(behind.begin(), behind.end(), r) == behind.end()) others.push_back(r);
  if (!others.empty())
    line += "; " + rank_list(others) + " wait in " + states[size_t(others.front())].call;
  if (!silent.empty()) line += "; " + rank_list(silent) + " wrote no report";
  line += "; each rank's last calls are in " + dir_ + "/rank_K.txt; ending the job, exit " +
          std::to_string(kExitHang);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // The launcher forwards output through a pipe: give it a moment before the job dies.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(MPI_COMM_WORLD, kExitHang);
}

}  // namespace tessera
