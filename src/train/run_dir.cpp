#include "train/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/files.hpp"
#include "io/checkpoint.hpp"
#include "parallel/comm.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".tessera.lock";

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// Fields 3 (state) and 22 (start time, clock ticks since boot) of /proc/PID/stat. With the pid,
// the start time names one process for good: a pid reused by a later process has another.
std::pair<std::string, std::string> state_and_start(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return {"", ""};
  std::istringstream fields(stat.substr(paren + 1));
  std::string state, field;
  fields >> state;
  for (int i = 4; i <= 22 && fields >> field; ++i) {
  }
  return {state, field};
}

std::string start_time(long pid) { return state_and_start(pid).second; }

std::string job_id() {
  for (const char* var : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"})
    if (const char* v = std::getenv(var); v && *v) return v;
  return "none";
}

// Which run of a requeued batch job this is (0 for the first).
long job_run() {
  for (const char* var : {"SLURM_RESTART_COUNT", "PBS_RUN_COUNT"})
    if (const char* v = std::getenv(var); v && *v) return std::atol(v);
  return 0;
}

// "key=value" fields of a lock file's line.
std::string field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string word; in >> word;)
    if (word.rfind(key + "=", 0) == 0) return word.substr(key.size() + 1);
  return "";
}

std::string read_fd(int fd) {
  std::string text(4096, '\0');
  const ssize_t n = pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? size_t(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

bool write_fd(int fd, const std::string& text) {
  return ftruncate(fd, 0) == 0 && pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size()) &&
         fsync(fd) == 0;
}

std::string now_text() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", std::localtime(&t));
  return buf;
}

// Whether the process a lock names is still running on this host: not gone, not a zombie (a
// killed rank its launcher has not reaped yet), and not a later process that reuses its pid.
bool running(const std::string& pid_text, const std::string& start) {
  const long pid = std::atol(pid_text.c_str());
  if (pid <= 0) return false;
  if (kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  const auto [state, started] = state_and_start(pid);
  if (state == "Z" || state == "X") return false;
  return start.empty() || started == start;
}

// A directory inside another (after resolving what exists of both paths).
bool inside(const std::string& inner, const std::string& outer) {
  std::error_code ec;
  const std::string a = fs::weakly_canonical(inner, ec).string();
  const std::string b = fs::weakly_canonical(outer, ec).string();
  return a == b || a.rfind(b + "/", 0) == 0;
}

// Rank 0: files of interrupted writes (a killed job's checkpoint .tmp, a half-written `latest`
// or deck) that nobody can be writing now that the lock is held. Returns what it removed.
std::vector<std::string> remove_stale(const std::string& dir, const std::vector<std::string>& fixed,
                                      bool checkpoints) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    const bool stale_step = checkpoints && f.size() == 20 && f.rfind("step_", 0) == 0 &&
                            f.substr(13) == ".h5.tmp";
    if ((stale_step || std::find(fixed.begin(), fixed.end(), f) != fixed.end()) &&
        fs::remove(entry.path(), ec))
      removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace

std::string lock_identity() {
  return "host=" + host_name() + " pid=" + std::to_string(getpid()) +
         " start=" + start_time(getpid()) + " job=" + job_id() + " run=" + std::to_string(job_run());
}

DirLock::~DirLock() { release(); }

void DirLock::release() {
  if (fd_ < 0) return;
  // Only the lock as this job wrote it: never one another job has since taken over.
  if (read_fd(fd_) == text_) unlink(path_.c_str());
  close(fd_);  // drops the flock too
  fd_ = -1;
}

std::string DirLock::acquire(const std::string& dir, std::string* note, bool* in_use) {
  path_ = (fs::path(dir) / kLockName).string();
  text_ = lock_identity() + " since=" + now_text();
  for (int attempt = 0; attempt < 3; ++attempt) {
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
      flock(fd_, LOCK_EX | LOCK_NB);  // where the file system has flock, a live holder is certain
      if (!write_fd(fd_, text_ + "\n")) {
        const std::string why = std::strerror(errno);
        close(fd_);
        fd_ = -1;
        unlink(path_.c_str());
        return "cannot write " + path_ + ": " + why;
      }
      return "";
    }
    if (errno != EEXIST) return "cannot create files in " + dir + ": " + std::strerror(errno);
    // Not a file (a FIFO, a directory, a socket): nothing tessera wrote; opening a FIFO to read
    // it would block.
    struct stat st {};
    if (lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return "cannot lock " + dir + ": " + path_ + " is not a regular file (" +
             (S_ISFIFO(st.st_mode)  ? "a FIFO"
              : S_ISDIR(st.st_mode) ? "a directory"
              : S_ISLNK(st.st_mode) ? "a symbolic link"
                                    : "a special file") +
             "), not a tessera lock: remove it";
    const int fd = open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue;  // its holder just let it go
      return "cannot read " + path_ + ": " + std::strerror(errno);
    }
    // A holder that is still exiting (a rank killed after another's MPI_Abort, not yet reaped)
    // lets go within moments: wait for its flock up to 3 s before calling it alive. Where the
    // file system has no flock, the lock's own text decides.
    bool flock_held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    for (int i = 0; i < 30 && flock_held; ++i) {
      usleep(100000);
      flock_held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    }
    const std::string holder = read_fd(fd);
    const std::string host = field(holder, "host"), pid = field(holder, "pid");
    if ((host.empty() || pid.empty()) && !flock_held) {  // garbage, or empty: no tessera lock
      close(fd);
      std::string shown = holder.substr(0, 40);
      for (char& c : shown)
        if (c < 32 || c > 126) c = '?';
      return "cannot lock " + dir + ": " + path_ + " is not a tessera lock (it holds " +
             (holder.empty() ? std::string("nothing") : "'" + shown + "'") +
             ", no host and pid): remove it if no tessera job uses " + dir;
    }
    const std::string job = field(holder, "job"), since = field(holder, "since");
    const std::string who = "host " + host + ", pid " + pid + ", job " + job +
                            (since.empty() ? "" : ", since " + since);
    const bool same_host = host == host_name();
    // A later run of the same batch job: the scheduler ended the earlier one before requeueing.
    const bool requeued = job != "none" && !job.empty() && job == job_id() &&
                          std::atol(field(holder, "run").c_str()) < job_run();
    if (!flock_held && ((same_host && !running(pid, field(holder, "start"))) || requeued)) {
      if (!write_fd(fd, text_ + "\n")) {
        const std::string why = std::strerror(errno);
        close(fd);
        return "cannot write " + path_ + ": " + why;
      }
      fd_ = fd;
      *note = "lock: took over " + path_ + " from " + who +
              (requeued ? " (an earlier run of this job)" : " (no longer running)");
      return "";
    }
    close(fd);
    *in_use = true;
    if (same_host || flock_held)
      return dir + " is in use by another tessera job (" + who + "; lock file " + path_ + ")";
    return dir + " is locked by a tessera job on another host (" + who + "; lock file " + path_ +
           "): tessera cannot see whether it still runs; if that job has ended, remove the lock "
           "file";
  }
  return "cannot lock " + dir + ": " + path_ + " keeps changing";
}

RunDirs::RunDirs(MPI_Comm comm, const std::string& run_dir, const std::string& checkpoint_dir,
                 uint64_t checkpoint_bytes) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string failure;
  int code = kExitIO;
  if (rank == 0) {
    std::string note;
    bool in_use = false;
    failure = make_directories(run_dir);
    if (failure.empty()) failure = run_lock_.acquire(run_dir, &note, &in_use);
    if (failure.empty()) failure = make_directories(checkpoint_dir);
    if (failure.empty() && !inside(checkpoint_dir, run_dir)) {
      if (!note.empty()) notes_.push_back(note);
      note.clear();
      failure = checkpoint_lock_.acquire(checkpoint_dir, &note, &in_use);
    }
    if (!note.empty()) notes_.push_back(note);
    if (in_use) code = kExitBadInput;
    if (failure.empty()) {
      for (const std::string& f :
           remove_stale(checkpoint_dir, {"latest.tmp", kProbeFile, kRoomFile}, true))
        notes_.push_back("checkpoint: removed " + f + ", left by an interrupted write");
      for (const std::string& f : remove_stale(run_dir, {"deck.yaml.tmp", "exit_status.tmp"}, false))
        notes_.push_back("run: removed " + f + ", left by an interrupted write");
      const long long free = free_bytes(checkpoint_dir);
      if (free >= 0 && uint64_t(free) < checkpoint_bytes)
        failure = "checkpoint directory " + checkpoint_dir + " has " + human_bytes(double(free)) +
                  " free, and a checkpoint of this model takes about " +
                  human_bytes(double(checkpoint_bytes)) + " (disk full?)";
    }
  }
  failure = agree_on_failure(comm, failure);
  MPI_Bcast(&code, 1, MPI_INT, 0, comm);
  if (failure.empty()) failure = probe_checkpoint_dir(comm, checkpoint_dir);
  if (!failure.empty()) throw UserError(failure, code);
}

}  // namespace tessera
