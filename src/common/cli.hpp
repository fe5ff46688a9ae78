#pragma once
// Command-line values: one reading of an integer flag for every subcommand.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/error.hpp"

namespace tessera {

// A decimal integer >= lo, or UserError "FLAG: expected an integer >= LO, got 'V'".
inline long parse_long(const std::string& flag, const std::string& v, long lo) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo)
    throw UserError(flag + ": expected an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}

}  // namespace tessera
