#include "backend/arena.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "common/error.hpp"

namespace tessera {

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Arena::~Arena() {
  if (!base_) return;
  if (allocator_.release) allocator_.release(base_);
  else std::free(base_);
}

size_t Arena::add(const std::string& name, size_t bytes) {
  if (base_) throw std::logic_error("Arena::add(" + name + ") after allocate()");
  buffers_.push_back({name, total_, bytes});
  total_ += round_up(bytes);
  return buffers_.size() - 1;
}

void Arena::allocate() {
  if (base_ || total_ == 0) return;
  void* p = allocator_.allocate ? allocator_.allocate(total_) : std::aligned_alloc(kAlign, total_);
  if (!p)
    throw UserError("out of memory: the run's buffers need " + std::to_string(total_ / 1000000) +
                        " MB in one allocation",
                    kExitIO, /*every_rank=*/false);
  base_ = static_cast<char*>(p);
  if (allocator_.describe)
    for (const Buffer& b : buffers_) allocator_.describe(base_ + b.offset, b.bytes, b.name.c_str());
}

void* Arena::pointer(size_t handle) const {
  if (!base_) throw std::logic_error("Arena::get before allocate()");
  return base_ + buffers_.at(handle).offset;
}

size_t Arena::bytes_named(const std::string& name) const {
  size_t n = 0;
  for (const Buffer& b : buffers_)
    if (b.name == name) n += b.bytes;
  return n;
}

std::string Arena::report() const {
  std::string out;
  char line[256];
  for (const Buffer& b : buffers_) {
    std::snprintf(line, sizeof line, "  %s: %.1f MB\n", b.name.c_str(), b.bytes / 1e6);
    out += line;
  }
  std::snprintf(line, sizeof line, "  total: %.1f MB in one allocation", total_ / 1e6);
  return out + line;
}

}  // namespace tessera
