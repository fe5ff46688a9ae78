#include "device/stream_wait.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/error.hpp"
#include "device/check.hpp"
#include "device/select.hpp"

namespace tessera::device {

namespace {
double g_limit = 0;
WaitCheck g_check = nullptr;
}  // namespace

void set_wait_limit(double seconds) { g_limit = seconds; }
double wait_limit() { return g_limit; }
void set_wait_check(WaitCheck check) { g_check = check; }

void wait_until(const std::function<bool()>& done, const char* what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (long polls = 0;; polls++) {
    if (g_check) g_check();  // at every wait, then between polls
    if (done()) return;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (g_limit > 0 && waited > g_limit) {
      char line[320];
      std::snprintf(line, sizeof line,
                    "%s: the device did not finish in %.0f s (run.hang_timeout, %.0f s when "
                    "unset): a collective's peer is lost or hangs",
                    what, waited, kDefaultWaitLimit);
      fail("wait_stream", line, __FILE__, __LINE__, kExitHang);
    }
    // A step's kernels finish in micro- to milliseconds: yield at first, then sleep a little so a
    // long wait (a collective behind a slow peer) does not take a core from the others.
    if (polls < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void wait_stream(cudaStream_t stream, const char* what) {
  wait_until(
      [stream] {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return true;
        if (e != cudaErrorNotReady) CUDA_CHECK(e);
        return false;
      },
      what);
}

}  // namespace tessera::device
