#pragma once
// How much host memory a run may still take, asked before anything large is allocated, so that a
// deck that asks for more is one line with the numbers rather than std::bad_alloc, the kernel's
// OOM killer, or a minute of paging.
#include <cstdint>
#include <string>

namespace tessera {

// Bytes this process may still allocate: the smaller of the kernel's MemAvailable and what is
// left under the memory limit of its cgroup (a batch job's allocation), if it has one. `source`
// receives which of the two it was, for messages.
uint64_t available_host_memory(std::string* source = nullptr);

// Throws UserError (exit 2) when `bytes` for `what` exceed available_host_memory():
// "WHAT needs 40.2 GB of host memory, 22.9 GB is available (MemAvailable)". For one process; the
// trainer sums the ranks of a node itself.
void require_host_memory(uint64_t bytes, const std::string& what);

}  // namespace tessera
