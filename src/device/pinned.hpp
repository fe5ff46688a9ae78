#pragma once
// The data input path's half on the host: page-locked buffers (cudaHostAlloc) the prefetcher
// fills, and a copy stream that moves them to the device with cudaMemcpyAsync while the compute
// stream works. The compute stream waits on an event, not on the host, so a batch's copy
// overlaps the previous step's kernels.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessera::device {

// `bytes` of pinned host memory. Pageable memory would make cudaMemcpyAsync stage through a
// driver buffer and block the host; pinned memory is copied by the DMA engine directly.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class CopyStream {
 public:
  CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  ~CopyStream();

  // Starts dst (device) <- src (pinned host), `bytes`, and marks its end. Returns at once; the
  // host must not refill src until the compute stream has waited (wait_on) and run past it, or
  // sync() was called.
  void to_device(void* dst, const void* src, size_t bytes);
  // Work queued on `compute` after this call starts only once the last to_device has landed.
  void wait_on(cudaStream_t compute) const;
  // Blocks the host until the last to_device has landed.
  void sync() const;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace tessera::device
