#pragma once
// The order a micro-batch's (token, choice) pairs take through the experts, from the router's
// choice (backend/moe_routing.hpp): rows grouped by expert, each expert's in token order, so
// every expert's GEMM reads one contiguous block and every layout puts a token's rows in the same
// order. Capacity (model.moe.capacity_factor): an expert computes at most `capacity` rows, the
// first tokens in token order; a choice past it is dropped (its row is -1 and adds nothing to
// its token's output). Host code: the choice is read back once per MoE layer and micro-batch.
#include <cstdint>
#include <vector>

namespace tessera {

struct MoeDispatch {
  std::vector<int32_t> counts;    // (E) rows each expert computes
  std::vector<int32_t> offsets;   // (E + 1) each expert's first row; offsets[E] = the rows
  std::vector<int32_t> token_of;  // (rows) each row's token
  std::vector<int32_t> slot_of;   // (N k) each (token, choice)'s row, -1 when dropped
  std::vector<int32_t> routed;    // (E) the choices of each expert before the capacity: its load
  int64_t dropped = 0;            // choices past the capacity
};

// The capacity of an expert for N tokens of k choices over E experts: ceil(factor N k / E);
// factor <= 0 is dropless (no bound: returns N, as no expert is chosen twice by a token).
int moe_capacity(double factor, int N, int k, int E);

// expert (N, k): the router's choice, each in [0, E).
MoeDispatch plan_dispatch(const int32_t* expert, int N, int k, int E, int capacity);

}  // namespace tessera
