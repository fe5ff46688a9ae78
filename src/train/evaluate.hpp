#pragma once
#include <cstdint>

#include "io/token_source.hpp"

namespace tessera {

// The validation set of a run: the first `batches` global batches of windows of the file, in file
// order, so every layout evaluates the same windows. Fewer when the file is short; UserError when
// it has not one batch. (TrainEngine::eval_loss_sum runs them.)
uint64_t eval_windows(const TokenSource& file, int seq_len, int batch_size, int batches);

}  // namespace tessera
