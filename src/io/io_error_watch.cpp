#include "io/io_error_watch.hpp"

#include <mpi.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/error.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// The first error of a watch, written by the handler (on whichever thread MPI-IO runs it) and
// read by the watcher: the text is complete before `when` is published.
struct Recorded {
  std::atomic<long long> when{0};  // steady-clock ticks; 0: none
  char text[MPI_MAX_ERROR_STRING + 64] = "";
};
Recorded g_recorded;

// The errno an MPI-IO error class stands for, where one does.
int errno_of(int error_class) {
  if (error_class == MPI_ERR_QUOTA) return EDQUOT;
  if (error_class == MPI_ERR_NO_SPACE) return ENOSPC;
  if (error_class == MPI_ERR_IO) return EIO;
  if (error_class == MPI_ERR_ACCESS || error_class == MPI_ERR_READ_ONLY) return EACCES;
  return 0;
}

// Records the first error, then returns it to the caller (HDF5) as MPI_ERRORS_RETURN would.
void on_file_error(MPI_File*, int* code, ...) {
  if (g_recorded.when.load() != 0) return;
  int error_class = 0, length = 0;
  char message[MPI_MAX_ERROR_STRING] = "";
  MPI_Error_class(*code, &error_class);
  MPI_Error_string(*code, message, &length);
  // ROMIO folds most write errors into MPI_ERR_IO and names the system's error in its message:
  // the errno whose text the message holds, else the class's.
  int err = errno_of(error_class);
  for (int e : {EDQUOT, ENOSPC, EIO, EACCES, EROFS, EFBIG})
    if (std::strstr(message, std::strerror(e)) != nullptr) err = e;
  if (err != 0)
    std::snprintf(g_recorded.text, sizeof g_recorded.text, "%s (errno %d)",
                  std::strerror(err), err);
  else
    std::snprintf(g_recorded.text, sizeof g_recorded.text, "%s", message);
  const long long now = Clock::now().time_since_epoch().count();
  g_recorded.when.store(now != 0 ? now : 1);
}

}  // namespace

IoErrorWatch::IoErrorWatch(std::string file, std::function<void()> cleanup,
                           std::function<std::string(const std::string&)> line)
    : file_(std::move(file)), cleanup_(std::move(cleanup)), line_(std::move(line)) {
  g_recorded.when.store(0);
  g_recorded.text[0] = '\0';
  thread_ = std::thread([this] { watch(); });
}

IoErrorWatch::~IoErrorWatch() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void IoErrorWatch::attach(MPI_File file) {
  static const MPI_Errhandler handler = [] {
    MPI_Errhandler h;
    MPI_File_create_errhandler(on_file_error, &h);
    return h;
  }();
  MPI_File_set_errhandler(file, handler);
}

std::string IoErrorWatch::recorded() {
  return g_recorded.when.load() != 0 ? std::string(g_recorded.text) : "";
}

void IoErrorWatch::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return done_; })) {
    const long long when = g_recorded.when.load();
    if (when == 0) continue;
    const Clock::time_point at{Clock::duration(when)};
    if (Clock::now() - at < std::chrono::duration<double>(agree_seconds())) continue;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    cleanup_();
    abort_with_line(line_("rank " + std::to_string(rank) + " cannot write " + file_ + ": " +
                          recorded()),
                    kExitIO);
  }
}

}  // namespace tessera
