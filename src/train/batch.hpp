#pragma once
// Micro-batches of windows read from a token file.
#include <cstdint>
#include <vector>

#include "io/sample_order.hpp"
#include "io/token_file.hpp"

namespace tessera {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;  // (B,T)
  Batch(int b, int t) : B(b), T(t), inputs(size_t(b) * t), targets(size_t(b) * t) {}
};

// Training: the B samples starting at global sample `first`, in the seeded order.
inline void read_train_batch(TokenFile& file, uint64_t first, uint64_t seed, int vocab,
                             Batch& batch) {
  const uint64_t n = file.num_windows(batch.T);
  for (int b = 0; b < batch.B; ++b) {
    const uint64_t w = sample_window(first + uint64_t(b), n, seed);
    file.read_window(w, batch.T, vocab, &batch.inputs[size_t(b) * batch.T],
                     &batch.targets[size_t(b) * batch.T]);
  }
}

// Evaluation: windows first, first+1, ... in file order.
inline void read_eval_batch(TokenFile& file, uint64_t first, int vocab, Batch& batch) {
  for (int b = 0; b < batch.B; ++b)
    file.read_window(first + uint64_t(b), batch.T, vocab, &batch.inputs[size_t(b) * batch.T],
                     &batch.targets[size_t(b) * batch.T]);
}

}  // namespace tessera
