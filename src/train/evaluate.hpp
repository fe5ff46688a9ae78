#pragma once
#include "io/token_file.hpp"
#include "model/gpt.hpp"

namespace tessera {

// Mean cross-entropy over the first `batches` micro-batches of `micro_batch` windows of the file
// (file order). Fewer batches are used when the file is short; UserError when it has none.
double evaluate_loss(Gpt& model, const float* params, TokenFile& file, int micro_batch,
                     int seq_len, int batches);

}  // namespace tessera
