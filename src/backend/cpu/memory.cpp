// The CPU backend's memory: host memory, and every transfer a memcpy.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/ops.hpp"

namespace tessera::cpu {

namespace {
// Zeroed: a buffer read before it is written reads 0 on every run, not whatever malloc left.
void* allocate(size_t bytes) {
  void* p = std::aligned_alloc(256, bytes);
  if (p) std::memset(p, 0, bytes);
  return p;
}
}  // namespace

Allocator memory() { return {allocate, std::free}; }
Allocator loader_memory() { return {}; }
void zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void await_uploads() {}
void poison(void*, size_t) {}
void sync() {}
std::string memory_report(const Arena&, bool) { return ""; }
double peak_gflops(bool, bool) { return 0.0; }

}  // namespace tessera::cpu
