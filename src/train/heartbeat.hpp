#pragma once
// Says what a long phase is doing (a token scan, a checkpoint read or write, an evaluation): a
// phase still running `first` seconds after it began prints "<what>: N s so far", and again every
// `every` seconds, until the Heartbeat is destroyed. Short phases print nothing, so the log of a
// small run, and the one-line errors found before training starts, stay as they are. The lines
// come from a thread of its own, which never calls MPI.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

class Heartbeat {
 public:
  using Sink = std::function<void(const std::string&)>;

  Heartbeat(bool active, std::string what, double first = 10, double every = 30,
            Sink sink = print) {
    if (!active) return;
    thread_ = std::thread([this, what = std::move(what), first, every, sink = std::move(sink)] {
      using Clock = std::chrono::steady_clock;
      const auto start = Clock::now();
      auto next = start + std::chrono::duration<double>(first);
      std::unique_lock<std::mutex> lock(mutex_);
      while (!cv_.wait_until(lock, next, [this] { return done_; })) {
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        char buf[32];
        std::snprintf(buf, sizeof buf, ": %.0f s so far", s);
        sink(what + buf);
        next += std::chrono::duration<double>(every);
      }
    });
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  ~Heartbeat() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  static void print(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace tessera
