#pragma once
// `tessera sample` and `tessera eval`: a trained checkpoint put to use on one rank.
#include <cstdint>
#include <string>

namespace tessera {

struct SampleOptions {
  std::string prompt;
  int tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  uint64_t seed = 1;
  std::string tokenizer;     // a token file whose tokenizer to use; "": the checkpoint's
};

// Writes the prompt and the generated text to stdout.
void sample_text(const std::string& checkpoint, const SampleOptions& options);

// Mean loss of the checkpoint's model on the first `batches` micro-batches of `data`
// (batches <= 0: the deck's eval.batches). Prints one line.
void eval_checkpoint(const std::string& checkpoint, const std::string& data, int batches);

}  // namespace tessera
