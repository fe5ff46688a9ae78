#include "io/eval_data.hpp"

#include <algorithm>

#include "common/error.hpp"

namespace tessera {

uint64_t eval_windows(const TokenSource& file, int seq_len, int batch_size, int batches) {
  const uint64_t windows = file.num_windows(seq_len);
  const uint64_t usable = std::min<uint64_t>(uint64_t(batches), windows / uint64_t(batch_size));
  if (usable == 0)
    throw UserError(file.spec() + ": too short to evaluate: " + std::to_string(windows) +
                    " windows of " + std::to_string(seq_len + 1) + " tokens, a batch needs " +
                    std::to_string(batch_size));
  return usable * uint64_t(batch_size);
}

}  // namespace tessera
