#pragma once
// The host side of a micro-batch's whole sequences (B sequences of T tokens, as the loader's
// batches hold them): context parallelism's share of them, and data.document_mask's ids.
#include <cstdint>

namespace tessera {

// cp rank r's chunks r and 2 cp - 1 - r (model/context_attention.hpp) of each sequence of `full`,
// in that order, into out (B, T / cp).
void context_chunks(const int32_t* full, int B, int T, int cp, int r, int32_t* out);

// Each token's document start in its sequence (the position after the last `eot` before it, else
// 0) into start, and its position in its document (its position minus that) into pos.
void document_ids(const int32_t* inputs, int B, int T, int64_t eot, int32_t* start, int32_t* pos);

}  // namespace tessera
