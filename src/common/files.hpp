#pragma once
// Checked file I/O for everything tessera reads or writes outside HDF5's own calls: what a path
// is (a FIFO, a directory, a device, a symbolic link loop) said in one line instead of "no such
// file", inputs opened without ever blocking on a FIFO, bounded reads, and writes whose every
// failure (a full disk, a read-only directory) comes back with its reason.
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace tessera {

// "a directory", "a FIFO (named pipe)", "a character device", "a block device", "a socket";
// "" for a regular file.
const char* file_kind(mode_t mode);

// `path` must be a regular file this process can read. Otherwise UserError naming `what` and the
// path: missing, unreadable or a symbolic link loop "cannot read WHAT PATH: REASON" (exit 1), a
// directory, FIFO, device or socket "WHAT PATH is a FIFO (named pipe), not a file" (exit 2).
// Checked before any open, so that opening a FIFO can never block.
void require_regular_file(const std::string& path, const std::string& what);

// Opens `path` for reading after require_regular_file (the open itself never blocks: O_NONBLOCK,
// and the opened file is checked again). Returns the descriptor (O_CLOEXEC, blocking mode).
int open_regular_file(const std::string& path, const std::string& what);

// The whole of a regular file, refused with UserError (exit 2) when it is larger than max_bytes.
std::string read_regular_file(const std::string& path, const std::string& what, size_t max_bytes);

// Writes `text` to PATH.tmp, flushes it to disk when `durable`, and renames it over `path`.
// Returns "" or the problem ("cannot write PATH: No space left on device"); PATH.tmp is removed
// on failure.
std::string write_file_atomically(const std::string& path, const std::string& text, bool durable);

// A file appended to line by line (metrics.jsonl, the data trace); every write checked.
class AppendFile {
 public:
  AppendFile() = default;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();
  // Creates or opens `path` for appending; "" or the problem.
  std::string open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  // Appends the text whole; "" or the problem ("cannot write PATH: No space left on device").
  std::string append(const std::string& text);

 private:
  int fd_ = -1;
  std::string path_;
};

// "cannot create directory PATH: REASON" (also when PATH exists and is not a directory), or "".
std::string make_directories(const std::string& path);

// Bytes the file system of `path` has free for this user (statvfs f_bavail), or -1 if unknown.
long long free_bytes(const std::string& path);

// "12.3 MB" (or "40.2 GB" from 10 GB on): a byte count for messages.
std::string human_bytes(double bytes);

}  // namespace tessera
