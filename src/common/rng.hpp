#pragma once
// Counter-based random numbers: every value is a pure function of (seed, stream, counter), so any
// rank can generate any element of any tensor without generating the ones before it.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace tessera {

// splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ULL;
  }
  return h;
}

// Stream key of a named object (a parameter tensor, the sampler) under a run seed.
constexpr uint64_t stream_key(uint64_t seed, std::string_view name) {
  return mix64(mix64(seed) ^ fnv1a64(name));
}

constexpr uint64_t counter_bits(uint64_t key, uint64_t counter) {
  return mix64(key ^ mix64(counter + 0x9E3779B97F4A7C15ULL));
}

// Uniform in [0, 1) with 53 random bits.
inline double counter_uniform(uint64_t key, uint64_t counter) {
  return static_cast<double>(counter_bits(key, counter) >> 11) * 0x1.0p-53;
}

// Standard normal for element `index` (Box-Muller on counters 2*index and 2*index+1).
inline double counter_normal(uint64_t key, uint64_t index) {
  const double u1 = static_cast<double>((counter_bits(key, 2 * index) >> 11) + 1) * 0x1.0p-53;
  const double u2 = counter_uniform(key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace tessera
