#pragma once
// `tessera ckpt diff`: compare two checkpoints tensor by tensor, so the test scripts need no HDF5
// module in Python (the GPU bundle runs them on nodes that have none).
#include <string>
#include <vector>

namespace tessera {

extern const char* const kCkptUsage;

// args: what follows `tessera ckpt`. Returns the exit status; throws UserError on bad input.
int ckpt_command(const std::vector<std::string>& args);

}  // namespace tessera
