#pragma once
// The shape of one block of context parallelism's attention (model/context_attention.hpp), read
// by attention_block_forward / attention_block_backward of each backend (backend/cpu/ops.hpp,
// backend/cuda/ops.hpp): the queries of a chunk of `rows` positions against the keys and values
// of another chunk of as many, for every (b, head). q and dq are in qkv's layout (row stride ldq,
// batch stride bq), out and dout (ldo, bo), the block's keys and values rows of [k heads | v
// heads] (ldkv, bkv); lse and delta are (B, NH, t_lse), pointed at the query chunk's first row.
// diagonal: the chunks are the same positions (key j visible to query i iff j <= i); otherwise
// every key is visible (the caller skips blocks wholly above the diagonal).
#include <cstddef>

namespace tessera {

struct AttentionBlock {
  int B, rows, NH, NKV, hs, ldq, ldo, ldkv, t_lse;
  size_t bq, bo, bkv;
  bool diagonal;
};

}  // namespace tessera
