// The CUDA emulator's race detector for streams: vector clocks and each range's last accesses
// (races.hpp).
#include "device/emu/races.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "device/emu/memory.hpp"

namespace tessera::emu {

namespace {

bool enabled() {
  static const bool on = [] {
    const char* s = std::getenv("TESSERA_EMU_RACES");
    const std::string v = s ? s : "on";
    if (v != "on" && v != "off") fault("TESSERA_EMU_RACES=" + v + ": expected on or off");
    return v == "on";
  }();
  return on;
}

// One count per stream (by the detector's stream number); absent counts are 0.
struct Clock {
  std::vector<uint64_t> c;
  uint64_t at(size_t i) const { return i < c.size() ? c[i] : 0; }
  void join(const Clock& o) {
    if (o.c.size() > c.size()) c.resize(o.c.size(), 0);
    for (size_t i = 0; i < o.c.size(); i++) c[i] = std::max(c[i], o.c[i]);
  }
};

struct Stream {
  std::string name;
  Clock clock;
};

// An access: the stream's count when the work was queued, and the work's name.
struct Access {
  size_t stream = SIZE_MAX;  // SIZE_MAX: none
  uint64_t epoch = 0;
  const char* op = nullptr;
};

// A byte range [start, end) with one history: its last write and each stream's last read since.
struct Segment {
  uintptr_t end;
  Access write;
  std::vector<Access> reads;
};

struct Region {
  uintptr_t end;
  std::string name;
};

std::mutex g_mutex;  // the prefetcher's and the checkpoint writer's threads copy too
std::map<const void*, size_t> g_stream_numbers;
std::vector<Stream> g_streams;
std::map<const void*, Clock> g_events;
Clock g_host;
std::map<uintptr_t, Segment> g_segments;  // by start; disjoint
std::map<uintptr_t, Region> g_regions;    // by start

// The legacy and per-thread default streams are one stream, as in streams.cpp.
size_t number(cudaStream_t s) {
  const void* key =
      s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr : static_cast<const void*>(s);
  auto [it, added] = g_stream_numbers.emplace(key, g_streams.size());
  if (added)
    g_streams.push_back({key ? "stream " + std::to_string(g_streams.size()) : "the default stream",
                         {}});
  return it->second;
}

std::string where(uintptr_t a) {
  char text[160];
  auto it = g_regions.upper_bound(a);
  if (it != g_regions.begin() && a < std::prev(it)->second.end) {
    --it;
    std::snprintf(text, sizeof text, "buffer \"%s\" (byte %zu of %zu)", it->second.name.c_str(),
                  size_t(a - it->first), size_t(it->second.end - it->first));
  } else {
    std::snprintf(text, sizeof text, "memory at %p", reinterpret_cast<void*>(a));
  }
  return text;
}

std::string work(const Access& a) {
  return std::string(a.op) + " on stream \"" + g_streams[a.stream].name + "\"";
}

// Whether `before` is ordered before work of stream s, whose clock is c.
bool ordered(const Access& before, size_t s, const Clock& c) {
  return before.stream == SIZE_MAX || before.stream == s || c.at(before.stream) >= before.epoch;
}

[[noreturn]] void race(uintptr_t a, const Access& now, bool writes, const Access& then,
                       bool wrote) {
  fault("race on " + where(a) + ": " + work(now) + (writes ? " writes" : " reads") + " what " +
        work(then) + (wrote ? " wrote" : " read") + ", with no event between them");
}

// A segment boundary at x (a segment holding x on both sides is cut in two).
void split(uintptr_t x) {
  auto it = g_segments.upper_bound(x);
  if (it == g_segments.begin()) return;
  --it;
  if (it->first < x && x < it->second.end) {
    Segment tail = it->second;
    it->second.end = x;
    g_segments.emplace(x, std::move(tail));
  }
}

void check_and_record(Segment& seg, uintptr_t start, const Access& now, bool write,
                      const Clock& c) {
  if (!ordered(seg.write, now.stream, c)) race(start, now, write, seg.write, true);
  if (write) {
    for (const Access& r : seg.reads)
      if (!ordered(r, now.stream, c)) race(start, now, true, r, false);
    seg.write = now;
    seg.reads.clear();
    return;
  }
  for (Access& r : seg.reads)
    if (r.stream == now.stream) {
      r = now;
      return;
    }
  seg.reads.push_back(now);
}

void apply(uintptr_t a, uintptr_t b, const Access& now, bool write, const Clock& c) {
  split(a);
  split(b);
  uintptr_t at = a;
  for (auto it = g_segments.lower_bound(a); at < b;) {
    if (it == g_segments.end() || it->first > at) {  // a gap: a range nothing touched yet
      const uintptr_t end = it == g_segments.end() ? b : std::min(b, it->first);
      it = g_segments.emplace_hint(it, at, Segment{end, {}, {}});
    }
    check_and_record(it->second, it->first, now, write, c);
    at = it->second.end;
    ++it;
  }
}

}  // namespace

void touch(cudaStream_t stream, const char* op, const std::vector<Touch>& touches) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const size_t s = number(stream);
  Clock& c = g_streams[s].clock;
  c.join(g_host);
  if (c.c.size() <= s) c.c.resize(s + 1, 0);
  const Access now{s, ++c.c[s], op};
  for (const Touch& t : touches) {
    if (!t.p || t.bytes == 0 || space_of(t.p, t.bytes) == Space::none) continue;
    const uintptr_t a = reinterpret_cast<uintptr_t>(t.p);
    apply(a, a + t.bytes, now, t.write, c);
  }
}

void touch(cudaStream_t stream, const char* op, std::initializer_list<Touch> touches) {
  touch(stream, op, std::vector<Touch>(touches));
}

void races_record(cudaEvent_t event, cudaStream_t stream) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  Clock& c = g_streams[number(stream)].clock;
  c.join(g_host);
  g_events[event] = c;
}

void races_wait(cudaStream_t stream, cudaEvent_t event) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto e = g_events.find(event);
  if (e != g_events.end()) g_streams[number(stream)].clock.join(e->second);
}

void host_waited(cudaStream_t stream) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_host.join(g_streams[number(stream)].clock);
}

void host_waited_event(cudaEvent_t event) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto e = g_events.find(event);
  if (e != g_events.end()) g_host.join(e->second);
}

void host_waited_all() {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Stream& s : g_streams) g_host.join(s.clock);
}

void races_forget_event(cudaEvent_t event) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.erase(event);
}

void forget_range(const void* p, size_t bytes) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + bytes;
  split(a);
  split(b);
  g_segments.erase(g_segments.lower_bound(a), g_segments.lower_bound(b));
  g_regions.erase(g_regions.lower_bound(a), g_regions.lower_bound(b));
}

void name_region(const void* p, size_t bytes, const char* name) {
  if (!enabled() || bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  g_regions[a] = {a + bytes, name};
}

void name_stream(cudaStream_t stream, const char* name) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_streams[number(stream)].name = name;
}

}  // namespace tessera::emu
