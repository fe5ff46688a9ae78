#pragma once
// run.hang_timeout (docs/checkpoints.md, "Long runs"): a thread on every rank that watches the rank's progress
// (parallel/comm.hpp's trace: a communication call starting or ending, a new step or phase). After
// `timeout` seconds without any it writes <run.dir>/hang/rank_K.txt (the rank's step, phase and
// ring of its last communication calls); rank 0 then reads every rank's file, prints one line
// naming the ranks that are behind and the call the others wait in, and ends the job with
// MPI_Abort (exit kExitHang), so that a hang does not burn the allocation until its wall time.
// The thread calls MPI only for MPI_Abort (the training thread asks for MPI_THREAD_MULTIPLE).
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

class Watchdog {
 public:
  Watchdog(const std::string& run_dir, int rank, int size, double timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();
  void hang(double idle);
  bool wait_for(double seconds);  // false once stopped

  std::string dir_;
  int rank_, size_;
  double timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera
