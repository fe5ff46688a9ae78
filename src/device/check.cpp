#include "device/check.hpp"

#include <string>

#include "common/error.hpp"

namespace tessera::device {

namespace {
int g_rank = -1, g_device = -1;
}

void set_identity(int world_rank, int device) {
  g_rank = world_rank;
  g_device = device;
}

void fail(const char* call, const char* reason, const char* file, int line, int exit_code) {
  std::string who = g_rank >= 0 ? "rank " + std::to_string(g_rank) : std::string("rank ?");
  who += g_device >= 0 ? ", GPU " + std::to_string(g_device) : std::string(", GPU ?");
  throw UserError(who + ": " + call + " failed: " + reason + " (" + file + ":" +
                      std::to_string(line) + ")",
                  exit_code, /*every_rank=*/false);
}

const char* cublas_reason(cublasStatus_t status) { return cublasGetStatusString(status); }
}  // namespace tessera::device
