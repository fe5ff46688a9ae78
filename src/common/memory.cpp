#include "common/memory.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/files.hpp"

namespace tessera {

namespace {

// A number from a one-line /proc or /sys file; 0 when absent, "max" or unreadable.
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  return std::strtoull(word.c_str(), nullptr, 10);
}

// What is left under this process's cgroup memory limit (v2, else v1), or 0 when it has none.
uint64_t cgroup_room() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    uint64_t limit = 0, used = 0;
    if (line.rfind("0::", 0) == 0) {
      limit = read_number("/sys/fs/cgroup" + path + "/memory.max");
      used = read_number("/sys/fs/cgroup" + path + "/memory.current");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      limit = read_number("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      used = read_number("/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes");
    }
    // v1 reports "no limit" as a number near 2^63.
    if (limit > 0 && limit < (uint64_t(1) << 60)) return limit > used ? limit - used : 1;
  }
  return 0;
}

}  // namespace

uint64_t available_host_memory(std::string* source) {
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") available = kb * 1024;
  }
  if (source) *source = "MemAvailable";
  if (const uint64_t room = cgroup_room(); room > 0 && (available == 0 || room < available)) {
    available = room;
    if (source) *source = "the job's cgroup memory limit";
  }
  return available == 0 ? UINT64_MAX : available;  // unknown: no check
}

void require_host_memory(uint64_t bytes, const std::string& what) {
  std::string source;
  const uint64_t available = available_host_memory(&source);
  if (bytes > available)
    throw UserError(what + " needs " + human_bytes(double(bytes)) + " of host memory, " +
                    human_bytes(double(available)) + " is available (" + source + ")");
}

}  // namespace tessera
