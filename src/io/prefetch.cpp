#include "io/prefetch.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/error.hpp"

namespace tessera {

DirectReader::DirectReader(bool direct) : direct_(direct) {}

DirectReader::~DirectReader() {
  for (auto& [path, f] : files_) close(f.fd);
  std::free(bounce_);
}

DirectReader::File& DirectReader::open_file(const std::string& path) {
  auto it = files_.find(path);
  if (it != files_.end()) return it->second;
  File f;
  // O_NONBLOCK: a file replaced by a FIFO since the sources were checked must not hang a reader
  // (it changes nothing for a regular file).
  if (direct_) {
    f.fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK);
    f.direct = f.fd >= 0;
  }
  if (f.fd < 0) f.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // tmpfs and others refuse O_DIRECT
  (f.direct ? direct_files_ : buffered_files_) += 1;
  if (f.fd < 0)
    throw UserError("cannot read token file " + path + ": " + std::strerror(errno), kExitIO, false);
  return files_.emplace(path, f).first->second;
}

void DirectReader::read(const std::string& path, uint64_t offset, uint64_t bytes,
                        unsigned char* dst) {
  File& f = open_file(path);
  const uint64_t start = f.direct ? offset & ~(kAlign - 1) : offset;
  const uint64_t end = f.direct ? (offset + bytes + kAlign - 1) & ~(kAlign - 1) : offset + bytes;
  unsigned char* buf = dst;
  if (f.direct) {
    if (end - start > bounce_bytes_) {
      std::free(bounce_);
      bounce_bytes_ = end - start;
      bounce_ = static_cast<unsigned char*>(std::aligned_alloc(kAlign, bounce_bytes_));
      if (!bounce_) throw UserError("out of memory for a read buffer", kExitIO, false);
    }
    buf = bounce_;
  }
  // A direct read may stop short at the end of the file, inside the last aligned block: enough
  // once the wanted bytes are in.
  const uint64_t need = offset + bytes - start;
  uint64_t got = 0;
  while (got < need) {
    const ssize_t n = pread(f.fd, buf + got, end - start - got, off_t(start + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && f.direct) {
      // The file system took the O_DIRECT open but refuses the read: buffered from here on.
      close(f.fd);
      f.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      f.direct = false;
      direct_files_ -= 1;
      buffered_files_ += 1;
      if (f.fd < 0)
        throw UserError("cannot read token file " + path + ": " + std::strerror(errno), kExitIO,
                        false);
      return read(path, offset, bytes, dst);
    }
    if (n < 0)
      throw UserError(path + ": read failed at byte " + std::to_string(start + got) + ": " +
                      std::strerror(errno), kExitIO, false);
    if (n == 0)
      throw UserError(path + ": unexpected end of file at byte " + std::to_string(start + got),
                      kExitBadInput, false);
    got += uint64_t(n);
  }
  if (f.direct) std::memcpy(dst, bounce_ + (offset - start), bytes);
}

std::string DirectReader::mode() const {
  const int direct = direct_files_, buffered = buffered_files_;
  if (direct > 0 && buffered > 0) return "O_DIRECT+pread";
  if (direct > 0) return "O_DIRECT";
  return buffered > 0 || !direct_ ? "pread" : "O_DIRECT (no file read yet)";
}

Prefetcher::Prefetcher(const Dataset& data, int vocab, uint64_t first, uint64_t stride, int count,
                       int depth, int readers, bool direct_io, Allocator memory)
    : data_(data), vocab_(vocab), count_(count), depth_(std::max(depth, 1)), first_(first),
      stride_(stride), memory_(memory) {
  for (const TokenSource& s : data.sources())
    if (s.extents().empty()) direct_path_ = false;  // a chunked HDF5 dataset: HDF5, main thread
  threaded_ = depth > 0 && direct_path_;
  const int T = data.seq_len();
  ring_.resize(size_t(threaded_ ? depth_ : 1));
  ready_.assign(ring_.size(), -1);
  const size_t per_slot = 2 * size_t(count) * size_t(T);  // inputs, then targets
  const size_t bytes = (ring_.size() * per_slot * sizeof(int32_t) + 4095) / 4096 * 4096;
  ring_memory_ = memory_.allocate ? memory_.allocate(bytes) : std::aligned_alloc(4096, bytes);
  if (!ring_memory_) throw UserError("out of host memory for the loader's buffers", kExitIO, false);
  for (size_t i = 0; i < ring_.size(); ++i) {
    ring_[i].inputs = static_cast<int32_t*>(ring_memory_) + i * per_slot;
    ring_[i].targets = ring_[i].inputs + size_t(count) * size_t(T);
    ring_[i].refs.resize(size_t(count));
  }
  const int n = threaded_ ? std::max(readers, 1) : 1;
  for (int r = 0; r < n; ++r) workers_.push_back(std::make_unique<Worker>(direct_io));
  if (threaded_)
    for (int r = 0; r < n; ++r) workers_[size_t(r)]->thread = std::thread([this, r] { run(r); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  if (memory_.release)
    memory_.release(ring_memory_);
  else
    std::free(ring_memory_);
}

void Prefetcher::fill(StepSamples& slot, uint64_t step, Worker& worker, bool direct) {
  const int T = data_.seq_len();
  slot.first = first_ + step * stride_;
  std::vector<uint32_t>& tokens = worker.tokens;
  tokens.resize(size_t(T) + 1);
  for (int i = 0; i < count_; ++i) {
    const uint64_t g = slot.first + uint64_t(i);
    int32_t* in = &slot.inputs[size_t(i) * T];
    int32_t* tg = &slot.targets[size_t(i) * T];
    slot.refs[size_t(i)] = data_.sample(g);
    const SampleRef& r = slot.refs[size_t(i)];
    const TokenSource& src = data_.sources()[size_t(r.source)];
    const uint64_t first = src.window_start(r.window, T);
    if (direct) {
      uint32_t* out = tokens.data();
      src.for_each_piece(first, uint64_t(T) + 1,
                         [&](const TokenExtent& x, uint64_t offset, uint64_t n) {
                           worker.bytes.resize(n * uint64_t(src.token_bytes()));
                           worker.reader.read(x.file, offset, worker.bytes.size(),
                                              worker.bytes.data());
                           decode_tokens(worker.bytes.data(), src.token_bytes(), n, out);
                           out += n;
                         });
    } else {
      src.read(first, tokens.size(), tokens.data());  // through HDF5: the main thread
    }
    src.to_sample(tokens.data(), first, T, vocab_, in, tg);
  }
}

void Prefetcher::run(int r) {
  const uint64_t n = workers_.size();
  for (uint64_t step = uint64_t(r);; step += n) {
    {
      // The slot of `step` is free once the consumer has handed back step - depth.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || step < consumed_ + uint64_t(depth_); });
      if (stop_) return;
    }
    const size_t slot = size_t(step % uint64_t(depth_));
    try {
      fill(ring_[slot], step, *workers_[size_t(r)], true);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_ || step < error_step_) {
        error_ = std::current_exception();
        error_step_ = step;
      }
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_[slot] = int64_t(step);
    }
    cv_.notify_all();
  }
}

const StepSamples& Prefetcher::next() {
  const auto t0 = std::chrono::steady_clock::now();
  if (!threaded_) {
    StepSamples& slot = ring_[0];
    fill(slot, consumed_++, *workers_[0], direct_path_);
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return slot;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (holding_) {  // the previous step's slot goes back to the readers
    consumed_ += 1;
    holding_ = false;
    cv_.notify_all();
  }
  const size_t slot = size_t(consumed_ % uint64_t(depth_));
  cv_.wait(lock, [&] {
    return ready_[slot] == int64_t(consumed_) || (error_ && error_step_ <= consumed_);
  });
  if (ready_[slot] != int64_t(consumed_)) std::rethrow_exception(error_);
  holding_ = true;
  wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ring_[slot];
}

double Prefetcher::take_wait_seconds() {
  const double w = wait_;
  wait_ = 0;
  return w;
}

std::string Prefetcher::mode() const {
  const std::string io = workers_[0]->reader.mode();
  if (!threaded_) return "read on the main thread (" + (direct_path_ ? io : "HDF5") + ")";
  return "prefetch " + std::to_string(depth_) + " steps ahead, " +
         std::to_string(workers_.size()) + " reader thread" + (workers_.size() > 1 ? "s" : "") +
         ", " + io;
}

}  // namespace tessera
