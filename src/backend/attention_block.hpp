#pragma once
// The shape of one block of context parallelism's attention (model/context_attention.hpp), read
// by attention_block_forward / attention_block_backward of each backend (backend/cpu/ops.hpp,
// backend/cuda/ops.hpp): the queries of a chunk of `rows` positions against the keys and values
// of another chunk of as many, for every (b, head). q and dq are in qkv's layout (row stride ldq,
// batch stride bq), out and dout (ldo, bo), the block's keys and values rows of [k heads | v
// heads] (ldkv, bkv); lse and delta are (B, NH, t_lse), pointed at the query chunk's first row.
// diagonal: the chunks are the same positions (key j visible to query i iff j <= i); otherwise
// every key is visible (the caller skips blocks wholly above the diagonal).
// q_start (data.document_mask; else nullptr): the first position of each query row's document,
// q_start[b * bstart + i], pointed at the query chunk's first row; key j, at position
// k_pos + j, is visible only from it on. A query row may see no key of a block: its block
// log-sum-exp is -inf and it merges nothing.
#include <cstddef>
#include <cstdint>

namespace tessera {

struct AttentionBlock {
  int B, rows, NH, NKV, hs, ldq, ldo, ldkv, t_lse;
  size_t bq, bo, bkv;
  bool diagonal;
  const int32_t* q_start = nullptr;
  size_t bstart = 0;
  int k_pos = 0;
};

}  // namespace tessera
