// The CUDA emulator's streams: deferred work and the order it runs in (streams.hpp).
#include "device/emu/streams.hpp"

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device/emu/memory.hpp"

namespace tessera::emu {

namespace {

// An item of a stream: work to run, or (no work) an edge: it may run once stream `after` has run
// its first `upto` items.
struct Item {
  std::function<void()> work;
  const void* after = nullptr;
  uint64_t upto = 0;
};
struct Queue {
  std::deque<Item> items;
  uint64_t queued = 0, done = 0;  // items ever queued; items run
};
struct Mark {
  const void* stream;
  uint64_t upto;
};

struct Mode {
  bool async = false;
  uint64_t seed = 1;
};
const Mode& mode() {
  static const Mode m = [] {
    Mode m;
    const char* s = std::getenv("TESSERA_EMU_STREAMS");
    const std::string v = s ? s : "sync";
    if (v == "sync") return m;
    bool ok = v == "async";
    if (v.rfind("async:", 0) == 0 && v.size() > 6) {
      char* end = nullptr;
      m.seed = std::strtoull(v.c_str() + 6, &end, 10);
      ok = *end == '\0';
    }
    if (!ok) fault("TESSERA_EMU_STREAMS=" + v + ": expected sync, async or async:SEED");
    m.async = true;
    return m;
  }();
  return m;
}

// The legacy and per-thread default streams are one stream here.
const void* key(cudaStream_t s) {
  return s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr : static_cast<const void*>(s);
}

std::recursive_mutex g_mutex;  // work may queue more work (a kernel never does; a flush may)
std::map<const void*, Queue> g_queues;
std::map<const void*, Mark> g_marks;

// The drains' draws, one sequence for the process.
std::mt19937_64& rng() {
  static std::mt19937_64 r(mode().seed);
  return r;
}

bool ready(const Item& item) {
  if (!item.after) return true;
  return g_queues[item.after].done >= item.upto;
}

// Runs the head item of the stream (which must be ready).
void run_head(const void* s) {
  Queue& q = g_queues[s];
  Item item = std::move(q.items.front());
  q.items.pop_front();
  if (item.work) item.work();
  g_queues[s].done++;
}

// Runs the stream's items until `upto` of them have run, first what their edges wait for.
void run_until(const void* s, uint64_t upto) {
  while (g_queues[s].done < upto) {
    Queue& q = g_queues[s];
    if (q.items.empty()) fault("an event edge waits for work that was never queued");
    const Item& head = q.items.front();
    if (!ready(head)) run_until(head.after, head.upto);
    run_head(s);
  }
}

}  // namespace

void enqueue(cudaStream_t stream, std::function<void()> work) {
  if (!mode().async) {
    work();
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Queue& q = g_queues[key(stream)];
  q.items.push_back({std::move(work), nullptr, 0});
  q.queued++;
}

void drain() {
  if (!mode().async) return;
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  std::vector<const void*> runnable;
  for (;;) {
    runnable.clear();
    bool pending = false;
    for (auto& [s, q] : g_queues) {
      if (q.items.empty()) continue;
      pending = true;
      if (ready(q.items.front())) runnable.push_back(s);
    }
    if (!pending) return;
    // Edges point at work queued before them, so some stream can always go on.
    if (runnable.empty()) fault("streams wait for each other in a cycle");
    run_head(runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng())]);
  }
}

void flush(cudaStream_t stream) {
  if (!mode().async) return;
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  const void* s = key(stream);
  run_until(s, g_queues[s].queued);
}

void record(cudaEvent_t event, cudaStream_t stream) {
  if (!mode().async) return;
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  const void* s = key(stream);
  g_marks[event] = {s, g_queues[s].queued};
}

void wait_event(cudaStream_t stream, cudaEvent_t event) {
  if (!mode().async) return;
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  const auto mark = g_marks.find(event);
  if (mark == g_marks.end()) return;
  Queue& q = g_queues[key(stream)];
  q.items.push_back({nullptr, mark->second.stream, mark->second.upto});
  q.queued++;
}

void forget_event(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  g_marks.erase(event);
}

}  // namespace tessera::emu
