#pragma once
// A training job's output places, taken before anything expensive starts: run.dir and the
// checkpoint directory are created and locked for the life of the job (a second job on them is
// refused with the holder's host, pid and job id), checked to take files through the same I/O
// paths the job will write them by (a plain file in run.dir, a parallel HDF5 file in the
// checkpoint directory, so a read-only directory or a name MPI-IO misreads is found at once,
// not after hours of training), checked for the room of one checkpoint, and cleaned of the .tmp
// files killed writes left.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// One lock file, DIR/.tessera.lock, held by rank 0 (and flock'ed where the file system allows):
// "host=H pid=P start=S job=J run=R since=T". Taken over when its holder is gone for sure: a
// process of this host that no longer runs (pid and start time match no live process), or an
// earlier run of this very batch job (same job id, a smaller SLURM_RESTART_COUNT or
// PBS_RUN_COUNT: the scheduler ended it before requeueing). A holder on another host may still be
// running: refused, saying so and what to do.
class DirLock {
 public:
  DirLock() = default;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();
  // "" or the problem: another job holds it (*in_use = true), or the directory takes no file.
  // `note` receives a log line when a stale lock was taken over.
  std::string acquire(const std::string& dir, std::string* note, bool* in_use);
  void release();

 private:
  std::string path_, text_;
  int fd_ = -1;
};

class RunDirs {
 public:
  // Collective over comm. Throws UserError on every rank alike: exit 2 for a directory another
  // job holds, exit 1 for one that cannot be created or written, or has no room for a
  // checkpoint of checkpoint_bytes.
  RunDirs(MPI_Comm comm, const std::string& run_dir, const std::string& checkpoint_dir,
          uint64_t checkpoint_bytes);
  // Rank 0: lines for the start-up log (stale locks taken over, stale files removed).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  DirLock run_lock_, checkpoint_lock_;
  std::vector<std::string> notes_;
};

// This process's identity in a lock file: "host=H pid=P start=S job=J run=R".
std::string lock_identity();

}  // namespace tessera
