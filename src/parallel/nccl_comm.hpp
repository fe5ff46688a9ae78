#pragma once
// An NCCL communicator twinned with one MPI communicator (tp, dp, pp, embed): the CUDA backend's
// transport, with the named calls of parallel/comm.hpp on device buffers, queued on the backend's
// stream (device::stream() when it is built). MPI stays the bootstrap: rank 0 of the MPI
// communicator makes the ncclUniqueId and MPI_Bcast hands it to the others. A communicator of one
// rank (or MPI_COMM_NULL) makes every call a no-op, as Comm does.
//
// Construction is collective over the MPI communicator and blocks until every member joins, so
// all ranks must build their NcclComms in the same order (the engine's fixed tp, dp, pp, embed).
// cudaSetDevice and device::init must have run first: the communicator binds to the current device.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera {

class NcclComm {
 public:
  NcclComm() = default;
  // overlap: the communicator's work runs on a stream of its own, ordered after the compute
  // stream's work queued before each call by an event, so that start_all_reduce_sum runs beside
  // the compute queued after it (the data-parallel sums during the last backward); every other
  // call, and wait_reductions, makes the compute stream wait for it again.
  explicit NcclComm(MPI_Comm comm, bool overlap = false);
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool active() const { return size_ > 1; }
  // The MPI communicator it twins (host-side collectives: checkpoints, the norm).
  MPI_Comm mpi() const { return mpi_; }

  // In place: x (n) = Σ (or max) over the ranks of x.
  template <typename T>
  void all_reduce_sum(T* x, size_t n);
  void all_reduce_max(float* x, size_t n);
  // x (n) summed in place, started now: the host never waits, and without `overlap` neither does
  // the compute stream (whatever it runs afterwards sees the sums). One call however large: NCCL
  // pipelines a big buffer itself, so the CPU's 16 MB buckets are not needed.
  void start_all_reduce_sum(float* x, size_t n);
  // The compute stream's later work sees every sum started.
  void wait_reductions();
  // send (size * count) summed over the ranks; this rank keeps block `rank` in recv (count).
  template <typename T>
  void reduce_scatter_sum(const T* send, T* recv, size_t count);
  // In place: x (size * count) summed, this rank's block left at x + rank * count (NCCL's
  // in-place placement) and returned.
  template <typename T>
  T* reduce_scatter_sum_in_place(T* x, size_t count) {
    reduce_scatter_sum(static_cast<const T*>(x), x + size_t(rank_) * count, count);
    return x + size_t(rank_) * count;
  }
  // recv (size * count) = every rank's send (count), in rank order (in place when send is
  // recv + rank * count).
  template <typename T>
  void all_gather(const T* send, T* recv, size_t count);
  // The same two started now on the communicator's stream; wait(ticket) makes the compute
  // stream's later work see the result (and the send buffer free). Without `overlap` they run
  // on the compute stream in order and the ticket is -1. progress() is Comm's, a no-op here.
  template <typename T>
  int start_all_gather(const T* send, T* recv, size_t count);
  template <typename T>
  int start_reduce_scatter_sum(const T* send, T* recv, size_t count);
  void wait(int ticket);
  void progress() {}

  // Expert parallelism's exchange (Comm's): the counts over MPI on the host, the rows as one
  // group of sends and receives.
  void all_to_all_counts(const int* send, int* recv, int n);
  template <typename T>
  void all_to_all_rows(const T* send, const int* send_rows, T* recv, const int* recv_rows,
                       size_t width);

  // Point to point, for the pipeline: group_start/end are ncclGroupStart/End. NCCL matches the
  // messages between two ranks in order and has no tags (`tag` is Comm's, ignored here), and the
  // stream orders a buffer's reuse after its send, so wait_send and wait_sends are no-ops.
  void group_start();
  void group_end();
  template <typename T>
  void send(const T* x, size_t n, int peer, int tag);
  template <typename T>
  void recv(T* x, size_t n, int peer, int tag);
  void wait_send(const void*) {}
  void wait_sends() {}

  // Payload bytes handed to NCCL, counted as Comm counts what it hands to MPI.
  uint64_t payload_bytes = 0;
  // Comm's blocked seconds: the host never blocks on NCCL's queued work, so it stays 0.
  double busy_seconds = 0;

  // Every live communicator's asynchronous error (ncclCommGetAsyncError): on one, the
  // communicator is aborted and the rank ends with one line naming it, its group and the last
  // call queued on it. device::wait_stream runs this between its polls.
  static void check_async_errors();

 private:
  // With `overlap`: stream_ waits for the compute stream's work so far (enter), the compute
  // stream for stream_'s (leave). Without, both are no-ops: stream_ is the compute stream.
  void enter();
  void leave();
  // A call's result: ncclInProgress (a nonblocking communicator's call still waiting for the
  // peers) polled until it finishes, under the device's wait bound; an error ends the rank.
  void issue(ncclResult_t result, const char* call);
  // Aborts the communicator and ends the rank with one line naming it and the call.
  [[noreturn]] void fail_on(ncclResult_t error, const char* call);

  ncclComm_t comm_ = nullptr;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t computed_ = nullptr, communicated_ = nullptr;  // overlap only
  // One event per started call (overlap only): recorded on stream_ after it, waited on by wait.
  int ticket();
  std::vector<cudaEvent_t> events_;
  std::vector<bool> taken_;
  int size_ = 1, rank_ = 0;
  const char* last_call_ = "none";
};

}  // namespace tessera
