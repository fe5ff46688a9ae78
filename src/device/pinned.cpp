#include "device/pinned.hpp"

#include <utility>

#include "device/check.hpp"

namespace tessera::device {

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);  // no check: a destructor must not throw
}

CopyStream::CopyStream() {
  // Non-blocking: the copy stream must not serialise with the legacy default stream.
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

CopyStream::~CopyStream() {
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CopyStream::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(done_, stream_));
}

void CopyStream::wait_on(cudaStream_t compute) const {
  CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0));
}

void CopyStream::sync() const { CUDA_CHECK(cudaEventSynchronize(done_)); }

}  // namespace tessera::device
