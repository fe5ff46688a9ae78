#pragma once
// The validation data of a run: which windows of the file a run evaluates (the same on every
// layout), and the micro-batches of them that the engine reads in file order.
#include <cstdint>
#include <vector>

#include "io/token_source.hpp"

namespace tessera {

// The validation set of a run: the first `batches` global batches of windows of the file, in file
// order, so every layout evaluates the same windows. Fewer when the file is short; UserError when
// it has not one batch. (TrainEngine::eval_loss_sum runs them.)
uint64_t eval_windows(const TokenSource& file, int seq_len, int batch_size, int batches);

// A micro-batch of windows: inputs and targets (B,T).
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;  // (B,T)
  Batch(int b, int t) : B(b), T(t), inputs(size_t(b) * t), targets(size_t(b) * t) {}
};

// Evaluation: windows first, first+1, ... in file order.
inline void read_eval_batch(const TokenSource& source, uint64_t first, int vocab, Batch& batch) {
  std::vector<uint32_t> buf(size_t(batch.T) + 1);
  for (int b = 0; b < batch.B; ++b) {
    const uint64_t start = (first + uint64_t(b)) * uint64_t(batch.T);
    source.read(start, buf.size(), buf.data());
    source.to_sample(buf.data(), start, batch.T, vocab, &batch.inputs[size_t(b) * batch.T],
                     &batch.targets[size_t(b) * batch.T]);
  }
}

}  // namespace tessera
