#include "device/arena.hpp"

#include <cstdio>
#include <stdexcept>

#include "device/check.hpp"

namespace tessera::device {

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);  // no check: a destructor must not throw, and the run is over
}

size_t DeviceArena::add(const std::string& name, size_t bytes) {
  if (base_) throw std::logic_error("DeviceArena::add(" + name + ") after allocate()");
  buffers_.push_back({name, total_, bytes});
  total_ += round_up(bytes);
  return buffers_.size() - 1;
}

void DeviceArena::allocate() {
  if (base_ || total_ == 0) return;
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, total_));
  base_ = static_cast<char*>(p);
}

void* DeviceArena::pointer(size_t handle) const {
  if (!base_) throw std::logic_error("DeviceArena::get before allocate()");
  return base_ + buffers_.at(handle).offset;
}

std::string DeviceArena::report() const {
  std::string out;
  char line[256];
  for (const Buffer& b : buffers_) {
    std::snprintf(line, sizeof line, "  %s: %.1f MB\n", b.name.c_str(), b.bytes / 1e6);
    out += line;
  }
  std::snprintf(line, sizeof line, "  total: %.1f MB in one cudaMalloc", total_ / 1e6);
  return out + line;
}

}  // namespace tessera::device
