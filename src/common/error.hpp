#pragma once
// Errors a user can cause (deck, data, checkpoint, layout). main() prints the message as one line
// on rank 0 and exits with exit_code: 2 for bad input, 1 for I/O failures. No stack trace.
#include <stdexcept>
#include <string>

namespace tessera {

inline constexpr int kExitIO = 1;
inline constexpr int kExitBadInput = 2;

struct UserError : std::runtime_error {
  int exit_code;
  explicit UserError(const std::string& message, int code = kExitBadInput)
      : std::runtime_error(message), exit_code(code) {}
};

}  // namespace tessera
