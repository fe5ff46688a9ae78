#pragma once
// A write error that one rank alone sees inside a collective HDF5 call (a project quota,
// EDQUOT; an I/O error, EIO; a full disk, ENOSPC) sends that rank down HDF5's error path into a
// different collective than its peers' (a flush's truncate against the others' writes): every
// rank then waits inside HDF5 for ever, and no rank returns to agree on the failure. So every
// rank records the first MPI-IO error of the file (an MPI error handler on HDF5's MPI file,
// which returns the error to HDF5 as before), and while a write runs a thread watches: an error recorded
// kAgreeSeconds ago in a write that has not ended means the write cannot end, and the thread
// runs `cleanup` (the partial file removed), prints one line naming the rank, the error, its
// errno and the file, and ends the job (MPI_Abort, exit 1). A write whose failure HDF5 returns
// to every rank ends sooner, through the usual agreement.
#include <mpi.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

class IoErrorWatch {
 public:
  // file: what the line names; line(why): the whole line for the error `why` (the checkpoint's
  // step and what stays kept), after cleanup().
  IoErrorWatch(std::string file, std::function<void()> cleanup,
               std::function<std::string(const std::string&)> line);
  ~IoErrorWatch();
  IoErrorWatch(const IoErrorWatch&) = delete;
  IoErrorWatch& operator=(const IoErrorWatch&) = delete;

  // Records the errors of `file` (HDF5's MPI-IO handle of the file written), then returns them
  // to HDF5 as before.
  static void attach(MPI_File file);
 private:
  // This rank's first MPI-IO error since the watch began ("" for none), as the line says it.
  static std::string recorded();
  void watch();

  std::string file_;
  std::function<void()> cleanup_;
  std::function<std::string(const std::string&)> line_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace tessera
