#pragma once
// checkpoint.async (docs/checkpoints.md, "Long runs"): a checkpoint written by a background thread from a host
// snapshot taken at the step boundary, while training goes on.
//
// MPI: the thread makes its collective and MPI-IO calls on a communicator of its own (a duplicate
// of the job's), concurrently with the training thread's calls on the others: this needs
// MPI_THREAD_MULTIPLE, which `tessera train` asks for (MPICH provides it). HDF5 (Debian's
// parallel build is not thread-safe): the thread holds hdf5_mutex() for the whole write, and every
// other HDF5 call of a run that can happen meanwhile (a chunked token file read by the loader or
// an evaluation) takes it too, so HDF5 has one user at a time; reading a checkpoint (a rollback)
// waits for the write first.
#include <mpi.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

class AsyncWriter {
 public:
  explicit AsyncWriter(MPI_Comm world);  // collective: duplicates world
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Runs write(comm) on the background thread (the previous write must have been waited for).
  // write returns the lines for the log; a UserError it throws is kept for wait().
  void start(std::function<std::vector<std::string>(MPI_Comm)> write);
  // Waits for the write in flight, if any: rethrows its UserError, else returns its lines (and
  // its seconds in *seconds). Call it at the same point on every rank.
  std::vector<std::string> wait(double* seconds = nullptr);
  bool busy() const { return thread_.joinable(); }
  bool finished() const { return done_.load(); }

  // The snapshot the write reads: parameters and the optimizer's state (one buffer per tensor
  // its rule declares), copied at the step boundary.
  std::vector<float> params;
  std::vector<std::vector<float>> state;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::vector<std::string> lines_;
  std::string error_;
  int error_code_ = 0;
  bool error_every_rank_ = true;
  double seconds_ = 0;
};

}  // namespace tessera
