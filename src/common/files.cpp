#include "common/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.hpp"

namespace tessera {

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

namespace {

std::string reason(int err) {
  if (err == ELOOP) return std::string(std::strerror(err)) + " (a symbolic link loop)";
  return std::strerror(err);
}

[[noreturn]] void refuse_kind(const std::string& path, const std::string& what, mode_t mode) {
  throw UserError(what + " " + path + " is " + file_kind(mode) + ", not a file", kExitBadInput);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    throw UserError("cannot read " + what + " " + path + ": " + reason(errno), kExitIO);
  if (!S_ISREG(st.st_mode)) refuse_kind(path, what, st.st_mode);
  if (access(path.c_str(), R_OK) != 0)
    throw UserError("cannot read " + what + " " + path + ": " + reason(errno), kExitIO);
}

int open_regular_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  // O_NONBLOCK: should the path have become a FIFO since the check, the open still returns.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot read " + what + " " + path + ": " + reason(errno), kExitIO);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    close(fd);
    refuse_kind(path, what, mode);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, size_t max_bytes) {
  const int fd = open_regular_file(path, what);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      throw UserError("cannot read " + what + " " + path + ": " + reason(err), kExitIO);
    }
    if (n == 0) break;
    if (text.size() + size_t(n) > max_bytes) {
      close(fd);
      throw UserError(what + " " + path + " is larger than " + std::to_string(max_bytes >> 10) +
                          " KiB: not a " + what + "?",
                      kExitBadInput);
    }
    text.append(buf, size_t(n));
  }
  close(fd);
  return text;
}

namespace {

// Every byte of `text` to fd; "" or the reason.
std::string write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return reason(errno);
    done += size_t(n);
  }
  return "";
}

}  // namespace

std::string write_file_atomically(const std::string& path, const std::string& text, bool durable) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write " + tmp + ": " + reason(errno);
  std::string why = write_all(fd, text);
  if (why.empty() && durable && fsync(fd) != 0) why = reason(errno);
  // close() reports what a network file system only finds out when the data leaves the node.
  if (close(fd) != 0 && why.empty()) why = reason(errno);
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0)
    why = "cannot rename " + tmp + " to " + path + ": " + reason(errno);
  else if (!why.empty())
    why = "cannot write " + path + ": " + why;
  if (!why.empty()) unlink(tmp.c_str());
  return why;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) close(fd_);
}

std::string AppendFile::open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd_ < 0) return "cannot write " + path + ": " + reason(errno);
  struct stat st;
  if (fstat(fd_, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    // A character device (/dev/null, /dev/full) takes writes; a FIFO or socket could block.
    const std::string kind = file_kind(st.st_mode);
    close(fd_);
    fd_ = -1;
    return "cannot write " + path + ": it is " + kind + ", not a file";
  }
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  return "";
}

std::string AppendFile::append(const std::string& text) {
  if (fd_ < 0) return "cannot write " + path_ + ": not open";
  const std::string why = write_all(fd_, text);
  return why.empty() ? "" : "cannot write " + path_ + ": " + why;
}

std::string make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    return "cannot create directory " + path + ": " + (ec ? ec.message() : reason(errno));
  if (!S_ISDIR(st.st_mode))
    return "cannot create directory " + path + ": it is " +
           (S_ISREG(st.st_mode) ? "a file" : file_kind(st.st_mode));
  return "";
}

long long free_bytes(const std::string& path) {
  struct statvfs s;
  if (statvfs(path.c_str(), &s) != 0) return -1;
  return (long long)s.f_bavail * (long long)s.f_frsize;
}

std::string human_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e10)
    std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

}  // namespace tessera
