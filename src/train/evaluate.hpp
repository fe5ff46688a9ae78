#pragma once
#include <cstdint>

#include "io/token_source.hpp"
#include "pipeline/executor.hpp"

namespace tessera {

// The validation set of a run: the first `batches` global batches of windows of the file, in file
// order, so every layout evaluates the same windows. Fewer when the file is short; UserError when
// it has not one batch.
uint64_t eval_windows(const TokenSource& file, int seq_len, int batch_size, int batches);

// Forward passes over windows [first, first + count) in micro-batches of the executor's size
// (count a multiple of it). Returns the sum of the micro-batches' mean losses: non-zero on the
// last pipeline stage only.
double evaluate_loss_sum(PipelineExecutor& executor, const float* params, const TokenSource& file,
                         int micro_batch, int seq_len, int vocab, uint64_t first, uint64_t count);

}  // namespace tessera
