#pragma once
// Named collectives over one communicator. Call sites read `tp.all_reduce_sum(partial, n)`, so
// every communication is visible where it happens. A communicator of one rank (or none) makes
// every call a no-op, so one code path serves every layout. Bytes are counted for `make bench`.
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tessera {

class Comm {
 public:
  Comm() = default;
  explicit Comm(MPI_Comm comm) : comm_(comm) {
    if (comm_ != MPI_COMM_NULL) {
      MPI_Comm_size(comm_, &size_);
      MPI_Comm_rank(comm_, &rank_);
    }
  }
  MPI_Comm get() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool active() const { return size_ > 1; }

  void all_reduce_sum(float* x, size_t n) { reduce(x, n, MPI_FLOAT, MPI_SUM, sizeof(float)); }
  void all_reduce_sum(double* x, size_t n) { reduce(x, n, MPI_DOUBLE, MPI_SUM, sizeof(double)); }
  void all_reduce_max(float* x, size_t n) { reduce(x, n, MPI_FLOAT, MPI_MAX, sizeof(float)); }

  // Payload bytes this rank handed to MPI on this communicator (what `make bench` and
  // tools/parallel_counts.py compare with the formulas; the ring volume follows from it).
  uint64_t payload_bytes = 0;
  void count(size_t bytes) { payload_bytes += bytes; }

 private:
  void reduce(void* x, size_t n, MPI_Datatype type, MPI_Op op, size_t elem) {
    if (!active() || n == 0) return;
    constexpr size_t kChunk = size_t(1) << 30;  // MPI counts are int
    for (size_t done = 0; done < n; done += kChunk)
      MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(x) + done * elem,
                    int(std::min(kChunk, n - done)), type, op, comm_);
    count(n * elem);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 1, rank_ = 0;
};

}  // namespace tessera
