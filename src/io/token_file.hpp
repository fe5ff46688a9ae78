#pragma once
// An HDF5 token file (docs/data.md): /tokens (uint16 or uint32) plus the tokenizer's attributes.
// Windows of T+1 tokens are read on demand with hyperslab selections.
#include <cstdint>
#include <string>
#include <vector>

#include "io/hdf5_util.hpp"
#include "io/tokenizer.hpp"

namespace tessera {

class TokenFile {
 public:
  // Throws UserError naming the file: missing (exit 1), not HDF5 / no /tokens / wrong dtype, data
  // that would read as zeros (never written, truncated, a virtual dataset, an external link)
  // or tokenizer attributes out of range (exit 2). The file is first opened, checked and its
  // first and last tokens read in a child process (io/contained.hpp), where libhdf5 crashing on
  // a damaged file is one more such error.
  explicit TokenFile(const std::string& path) : TokenFile(path, true) {}

  const std::string& path() const { return path_; }
  uint64_t num_tokens() const { return num_tokens_; }
  const TokenizerInfo& tokenizer() const { return tokenizer_; }
  // Byte offset of /tokens in the file when it is one contiguous, unfiltered, little-endian
  // dataset (as tools/data/prepare_data.py writes it, 4 KiB aligned), so it can be read without HDF5;
  // -1 otherwise.
  int64_t contiguous_offset() const { return contiguous_offset_; }
  int token_bytes() const { return token_bytes_; }
  int64_t num_documents() const { return num_documents_; }  // -1: no num_documents attribute
  // Windows of seq_len + 1 tokens at stride seq_len.
  uint64_t num_windows(int seq_len) const {
    return num_tokens_ < 2 ? 0 : (num_tokens_ - 1) / uint64_t(seq_len);
  }

  // Tokens [first, first + count) as uint32. Main thread only: HDF5 is not thread-safe. A file
  // that has shrunk since it was opened is a UserError, not zeros.
  void read(uint64_t first, uint64_t count, uint32_t* out);

 private:
  TokenFile(const std::string& path, bool contained);
  void check_storage(hid_t type);

  std::string path_;
  H5Handle file_, dataset_, file_space_;
  uint64_t num_tokens_ = 0;
  uint64_t file_bytes_ = 0;  // the file's size when opened
  int64_t contiguous_offset_ = -1;
  int token_bytes_ = 2;
  int64_t num_documents_ = -1;
  TokenizerInfo tokenizer_;
};

}  // namespace tessera
