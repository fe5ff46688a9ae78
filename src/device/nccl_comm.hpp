#pragma once
// An NCCL communicator twinned with one MPI communicator (tp, dp, pp, embed), the GPU transport
// of parallel/comm.hpp: the same named collectives, on device buffers and a stream. MPI stays the
// bootstrap: rank 0 of the MPI communicator makes the ncclUniqueId and MPI_Bcast hands it to the
// others. A communicator of one rank (or MPI_COMM_NULL) makes every call a no-op, as Comm does.
//
// Construction is collective over the MPI communicator and blocks until every member joins, so
// all ranks must build their NcclComms in the same order (the trainer's fixed tp, dp, pp, embed).
// cudaSetDevice must have been called first: the communicator binds to the current device.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace tessera::device {

class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(MPI_Comm comm);
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
  void all_reduce_sum(T* x, size_t n, cudaStream_t stream);
  void all_reduce_max(float* x, size_t n, cudaStream_t stream);
  // send (size * recv_count) summed over ranks; this rank keeps block `rank` in recv (recv_count).
  template <typename T>
  void reduce_scatter_sum(const T* send, T* recv, size_t recv_count, cudaStream_t stream);
  // recv (size * send_count) = every rank's send (send_count), in rank order.
  template <typename T>
  void all_gather(const T* send, T* recv, size_t send_count, cudaStream_t stream);
  // Point to point (the pipeline's activations and their gradients). A send and its recv must
  // be issued in matching order on both ranks; grouping is the caller's (ncclGroupStart/End).
  template <typename T>
  void send(const T* x, size_t n, int peer, cudaStream_t stream);
  template <typename T>
  void recv(T* x, size_t n, int peer, cudaStream_t stream);

  // Payload bytes handed to NCCL, counted as Comm counts what it hands to MPI.
  uint64_t payload_bytes = 0;

 private:
  ncclComm_t comm_ = nullptr;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int size_ = 1, rank_ = 0;
};

}  // namespace tessera::device
