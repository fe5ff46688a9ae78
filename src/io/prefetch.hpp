#pragma once
// GPUDirect-Storage-style input (docs/data.md): a background thread per rank reads only this rank's
// samples of the coming steps into a bounded ring of buffers, with O_DIRECT reads of aligned
// blocks straight from the tokens' file offsets (no page cache, no HDF5 on the hot path), falling
// back to pread where the file system refuses O_DIRECT. The trainer's step computes while the
// next steps are read; next() reports how long it had to wait.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/arena.hpp"
#include "io/dataset.hpp"

namespace tessera {

// Reads byte ranges of files, O_DIRECT when allowed: the covering 4 KiB-aligned blocks go into an
// aligned bounce buffer and the wanted bytes are copied out.
class DirectReader {
 public:
  static constexpr uint64_t kAlign = 4096;
  explicit DirectReader(bool direct);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;
  void read(const std::string& file, uint64_t offset, uint64_t bytes, unsigned char* dst);
  // "O_DIRECT", "pread" or "O_DIRECT+pread" (some files refused it): for the log.
  std::string mode() const;

 private:
  struct File {
    int fd = -1;
    bool direct = false;
  };
  File& open_file(const std::string& path);
  bool direct_;
  std::map<std::string, File> files_;
  std::atomic<int> direct_files_{0}, buffered_files_{0};  // mode() reads them from another thread
  unsigned char* bounce_ = nullptr;
  uint64_t bounce_bytes_ = 0;
};

// One step's samples on this rank: count windows of T + 1 tokens, as model inputs and targets.
// inputs and targets point into the ring's one allocation, from the Allocator the loader is
// given: aligned host memory by default, page-locked on a GPU so its copy engine reads it directly.
struct StepSamples {
  uint64_t first = 0;            // global index of the first sample
  int32_t* inputs = nullptr;     // (count, T)
  int32_t* targets = nullptr;    // (count, T)
  std::vector<SampleRef> refs;   // (count)
};

class Prefetcher {
 public:
  // Step j (j = 0, 1, ...) is global samples [first + j*stride, first + j*stride + count).
  // depth: steps read ahead (0: next() reads on the calling thread); readers: threads that read
  // them, each a whole step at a time (step j goes to thread j mod readers), so that many reads
  // are in flight: random reads of a few KiB are bound by the disk's latency, not its bandwidth.
  // A chunked HDF5 source has no file offset to read from: it is read on the calling thread
  // through HDF5 whatever depth says.
  Prefetcher(const Dataset& data, int vocab, uint64_t first, uint64_t stride, int count, int depth,
             int readers, bool direct_io, Allocator memory = {});
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next step's samples, valid until the following call. A read error (a bad token id, a
  // failing disk) is rethrown here, at the step that met it.
  const StepSamples& next();
  // Seconds next() spent waiting, summed since the last call of take_wait_seconds.
  double take_wait_seconds();
  std::string mode() const;

 private:
  struct Worker {
    explicit Worker(bool direct) : reader(direct) {}
    DirectReader reader;
    std::vector<uint32_t> tokens;     // one window, decoded
    std::vector<unsigned char> bytes;  // one window as stored
    std::thread thread;
  };
  void fill(StepSamples& slot, uint64_t step, Worker& worker, bool direct);
  void run(int r);

  const Dataset& data_;
  const int vocab_, count_, depth_;
  const uint64_t first_, stride_;
  bool direct_path_ = true, threaded_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  Allocator memory_;
  void* ring_memory_ = nullptr;    // every slot's inputs and targets, one allocation
  std::vector<StepSamples> ring_;
  std::vector<int64_t> ready_;     // per slot: the step it holds, complete; -1 none
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t consumed_ = 0;          // steps handed back by the consumer
  bool stop_ = false, holding_ = false;
  std::exception_ptr error_;
  uint64_t error_step_ = 0;
  double wait_ = 0;
};

}  // namespace tessera
