#include "train/evaluate.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "train/batch.hpp"

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

double evaluate_loss_sum(PipelineExecutor& executor, const float* params, const TokenSource& file,
                         int micro_batch, int seq_len, int vocab, uint64_t first, uint64_t count) {
  const size_t n = size_t(count / uint64_t(micro_batch));
  std::vector<Batch> batches(n, Batch(micro_batch, seq_len));
  std::vector<MicroBatch> views(n);
  for (size_t i = 0; i < n; ++i) {
    read_eval_batch(file, first + i * uint64_t(micro_batch), vocab, batches[i]);
    views[i] = {batches[i].inputs.data(), batches[i].targets.data()};
  }
  return executor.forward_only(params, views);
}

}  // namespace tessera
