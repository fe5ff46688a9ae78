#include "train/evaluate.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "train/batch.hpp"

namespace tessera {

double evaluate_loss(Gpt& model, const float* params, TokenFile& file, int micro_batch,
                     int seq_len, int batches) {
  const uint64_t windows = file.num_windows(seq_len);
  const uint64_t usable = std::min<uint64_t>(uint64_t(batches), windows / uint64_t(micro_batch));
  if (usable == 0)
    throw UserError(file.path() + ": too short to evaluate: " + std::to_string(windows) +
                    " windows of " + std::to_string(seq_len + 1) + " tokens, a batch needs " +
                    std::to_string(micro_batch));
  Batch batch(micro_batch, seq_len);
  double sum = 0;
  for (uint64_t i = 0; i < usable; ++i) {
    read_eval_batch(file, i * uint64_t(micro_batch), model.layout().shape.vocab_size, batch);
    sum += model.forward(params, batch.inputs.data(), batch.targets.data(), batch.B, batch.T);
  }
  return sum / double(usable);
}

}  // namespace tessera
