#pragma once
// The data order: global sample g of a run is window permute(g % n, n, seed, g / n) of the token
// file, a pure function of (seed, epoch, index) so every layout and every restart sees the same
// sequence. tools/data/tessera_data.py implements the same function for the PyTorch reference.
#include <bit>
#include <cstdint>

#include "common/rng.hpp"

namespace tessera {

// A bijection of [0, n): a 4-round Feistel network on the smallest even bit width that covers n,
// with cycle walking for the values that fall outside.
inline uint64_t permute(uint64_t j, uint64_t n, uint64_t seed, uint64_t epoch) {
  const int bits = n <= 4 ? 2 : int(std::bit_width(n - 1));
  const int half = (bits + 1) / 2;
  const uint64_t hmask = (uint64_t(1) << half) - 1;
  const uint64_t key = mix64(seed * 0x9E3779B97F4A7C15ULL + epoch + 1);
  uint64_t x = j;
  while (true) {
    uint64_t left = x >> half, right = x & hmask;
    for (uint64_t r = 0; r < 4; ++r) {
      const uint64_t f = mix64(right ^ (key + r)) & hmask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
    if (x < n) return x;
  }
}

// Window index of global sample g when the file holds n windows.
inline uint64_t sample_window(uint64_t g, uint64_t n, uint64_t seed) {
  return permute(g % n, n, seed, g / n);
}

}  // namespace tessera
