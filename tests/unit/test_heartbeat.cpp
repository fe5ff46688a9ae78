// The heartbeat of long phases: silent when the phase is short, a line after `first` seconds and
// every `every` seconds after that, each naming the phase.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "train/heartbeat.hpp"

using namespace tessera;

namespace {
struct Lines {
  std::mutex mutex;
  std::vector<std::string> lines;
  Heartbeat::Sink sink() {
    return [this](const std::string& s) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(s);
    };
  }
};
}  // namespace

TEST(Heartbeat, ShortPhaseIsSilent) {
  Lines out;
  { const Heartbeat beat(true, "eval: step 10", 0.5, 0.5, out.sink()); }
  EXPECT_TRUE(out.lines.empty());
}

TEST(Heartbeat, LongPhaseSaysWhatItIsDoing) {
  Lines out;
  const auto start = std::chrono::steady_clock::now();
  {
    const Heartbeat beat(true, "checkpoint: writing step 4", 0.1, 0.1, out.sink());
    std::this_thread::sleep_for(std::chrono::milliseconds(450));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_GE(out.lines.size(), 3u);
  EXPECT_LE(double(out.lines.size()), seconds / 0.1);  // one per 0.1 s at most, from 0.1 s on
  for (const std::string& line : out.lines)
    EXPECT_EQ(line.rfind("checkpoint: writing step 4: ", 0), 0u) << line;
  EXPECT_NE(out.lines.front().find(" s so far"), std::string::npos) << out.lines.front();
  const size_t n = out.lines.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(out.lines.size(), n);  // nothing after the phase ended
}

TEST(Heartbeat, InactiveRankIsSilent) {
  Lines out;
  {
    const Heartbeat beat(false, "data: checking", 0.01, 0.01, out.sink());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(out.lines.empty());
}
