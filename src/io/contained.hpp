#pragma once
// A reader of a user's file, run first in a child process where a crash, a runaway allocation or
// a loop inside a library cannot take the job down. libhdf5 1.10 overflows buffers, crashes and
// loops on some damaged files (tests/fuzz, token_hdf5: attribute and object-header parsing); what
// it does there is not ours to fix, but a damaged file must still end as one line naming it.
#include <functional>
#include <string>

namespace tessera {

// Seconds the child may take before it is killed and the file called damaged. tests/fuzz lowers
// it below libFuzzer's own timeout.
extern double contained_seconds;

// Runs check() in a child process (fork, no exec: the child runs no MPI and ends with _exit) and
// returns once it returned. Rethrows the child's UserError (message, exit status); throws
// UserError("<what>: <how it ended>") when the child crashed, was killed or ran out of time.
// Takes hdf5_mutex() across the fork, so that no other thread is inside libhdf5 when the child
// is made. Where fork fails, check() runs here instead.
void run_contained(const std::string& what, const std::function<void()>& check);

}  // namespace tessera
