#pragma once
// A backend's memory, allocated once at start: every buffer a run needs (parameters, gradients,
// master weights, moments, activations, token buffers) is declared first with its name and size,
// then one allocation holds them all and nothing is allocated during training. llm.c's single
// parameter and activation allocations, with names, so the start-up log shows where memory goes.
// The allocation comes from the backend (host memory on the CPU, cudaMalloc on a GPU).
#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

// Where memory comes from: a backend's buffers, or the data loader's ring (pinned on a GPU).
// A default Allocator means plain aligned host memory.
// `describe`, when set, is told each buffer's place and name once allocated (the CUDA emulator
// names buffers in its race reports by it).
struct Allocator {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
  void (*describe)(const void* p, size_t bytes, const char* name) = nullptr;
};

class Arena {
 public:
  explicit Arena(Allocator allocator) : allocator_(allocator) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Declares a buffer of `bytes`; returns its handle for get(). Only before allocate().
  size_t add(const std::string& name, size_t bytes);
  // One allocation of the sum (each buffer starts 256-byte aligned, as cudaMalloc's own
  // pointers: 16-byte vector accesses and cuBLAS's alignment preferences both hold).
  void allocate();
  bool allocated() const { return base_ != nullptr; }

  template <typename T>
  T* get(size_t handle) const {
    return static_cast<T*>(pointer(handle));
  }
  size_t bytes(size_t handle) const { return buffers_.at(handle).bytes; }
  size_t total_bytes() const { return total_; }
  // The bytes of every buffer declared as `name` (one per model chunk where each declares its
  // own).
  size_t bytes_named(const std::string& name) const;
  // One line per buffer, "  name: 123.4 MB", and a total line: what rank 0 logs at start.
  std::string report() const;

 private:
  struct Buffer {
    std::string name;
    size_t offset, bytes;
  };
  void* pointer(size_t handle) const;
  Allocator allocator_;
  std::vector<Buffer> buffers_;
  size_t total_ = 0;
  char* base_ = nullptr;
};

}  // namespace tessera
