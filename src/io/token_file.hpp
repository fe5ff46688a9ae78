#pragma once
// An HDF5 token file (DESIGN §8): /tokens (uint16 or uint32) plus the tokenizer's attributes.
// Windows of T+1 tokens are read on demand with hyperslab selections.
#include <cstdint>
#include <string>
#include <vector>

#include "io/hdf5_util.hpp"

namespace tessera {

struct TokenizerInfo {
  std::string type = "byte";   // "byte": token = byte value, eot = 256
  int64_t vocab_size = 0;
  int64_t eot = -1;
};

class TokenFile {
 public:
  // Throws UserError naming the file: missing (exit 1), not HDF5 / no /tokens / wrong dtype (exit 2).
  explicit TokenFile(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t num_tokens() const { return num_tokens_; }
  const TokenizerInfo& tokenizer() const { return tokenizer_; }
  // Windows of seq_len + 1 tokens at stride seq_len.
  uint64_t num_windows(int seq_len) const {
    return num_tokens_ < 2 ? 0 : (num_tokens_ - 1) / uint64_t(seq_len);
  }

  // Reads window w into inputs (first T tokens) and targets (last T). Every id must be below
  // vocab_size, else UserError naming the file, the token index and the value.
  void read_window(uint64_t w, int seq_len, int vocab_size, int32_t* inputs, int32_t* targets);

 private:
  std::string path_;
  H5Handle file_, dataset_, file_space_;
  uint64_t num_tokens_ = 0;
  TokenizerInfo tokenizer_;
  std::vector<uint32_t> buffer_;
};

}  // namespace tessera
