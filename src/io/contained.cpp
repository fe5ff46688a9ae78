#include "io/contained.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/error.hpp"
#include "io/hdf5_util.hpp"

namespace tessera {

double contained_seconds = 60;

namespace {

constexpr int kChildUserError = 3;

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return;  // the parent is gone or the pipe broke: nothing more to tell
    p += w;
    n -= size_t(w);
  }
}

[[noreturn]] void child(int fd, const std::function<void()>& check) {
  // A crash ends the child quietly (UCX's handlers, inherited, would print a backtrace) and its
  // stderr goes nowhere: the parent says in one line what happened.
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
  if (const int null = open("/dev/null", O_WRONLY); null >= 0) dup2(null, STDERR_FILENO);
  int status = 0;
  try {
    check();
  } catch (const UserError& e) {
    // The record: exit status, whether every rank meets it, the message.
    const int head[2] = {e.exit_code, e.every_rank ? 1 : 0};
    write_all(fd, head, sizeof head);
    write_all(fd, e.what(), std::strlen(e.what()));
    status = kChildUserError;
  } catch (...) {
    status = 4;
  }
  // No atexit handlers, no stdio flush, no MPI: they belong to the parent.
  _exit(status);
}

}  // namespace

void run_contained(const std::string& what, const std::function<void()>& check) {
  int fds[2];
  pid_t pid = -1;
  {
    const std::lock_guard<std::mutex> lock(hdf5_mutex());
    if (pipe2(fds, O_CLOEXEC) == 0) {
      std::fflush(nullptr);  // what the parent has buffered is printed once, by the parent
      pid = fork();
      if (pid == 0) {
        close(fds[0]);
        hdf5_mutex().unlock();  // this thread's lock, copied into the child
        child(fds[1], check);
      }
      close(fds[1]);
      if (pid < 0) close(fds[0]);
    }
  }
  if (pid < 0) {
    check();
    return;
  }
  std::string record;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(contained_seconds);
  bool done = false, timed_out = false;
  while (!done) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = poll(&p, 1, int(std::min(left * 1000, 1000.0)) + 1);
    if (r < 0 && errno != EINTR) {
      kill(pid, SIGKILL);  // no way left to wait for it within the limit: it ends here
      break;
    }
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) record.append(buf, size_t(n));
    else if (n == 0 || errno != EINTR) done = true;
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", contained_seconds);
    throw UserError(what + ": reading it did not end in " + seconds +
                    " s (a damaged HDF5 file makes libhdf5 loop or allocate without bound)");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildUserError && record.size() > 2 * sizeof(int)) {
    int head[2];
    std::memcpy(head, record.data(), sizeof head);
    throw UserError(record.substr(sizeof head), head[0], head[1] != 0);
  }
  const std::string how = WIFSIGNALED(status)
                              ? "crashed (signal " + std::to_string(WTERMSIG(status)) + ", " +
                                    strsignal(WTERMSIG(status)) + ")"
                              : "failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  throw UserError(what + ": the HDF5 library " + how +
                  " reading it: the file is damaged (check it with h5dump, or make it again)");
}

}  // namespace tessera
