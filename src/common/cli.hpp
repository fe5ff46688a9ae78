#pragma once
// Command-line values: one reading of an integer flag for every subcommand, into 64 bits and
// checked against its range, so that 4294967297 is refused rather than narrowed to 1.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"

namespace tessera {

// A decimal integer in [lo, hi], or UserError "FLAG: expected an integer from LO to HI, got 'V'".
inline int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    throw UserError(flag + ": expected an integer from " + std::to_string(lo) + " to " +
                    std::to_string(hi) + ", got '" + v + "'");
  return x;
}

}  // namespace tessera
