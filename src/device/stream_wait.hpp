#pragma once
// Host waits on a stream that a collective can block. cudaStreamSynchronize waits for ever when a
// peer of a queued NCCL collective is lost to a node or network fault, and every other rank spins
// until the job's wall time. wait_stream polls the stream instead: between polls it runs the
// registered check (the NCCL communicators' asynchronous errors, parallel/nccl_comm.cpp), and
// past the limit (run.hang_timeout, else select.hpp's kDefaultWaitLimit) it throws a one-line
// error naming what it waited for, exit 5 as the watchdog's; main prints it and MPI_Abort ends
// the job. wait_until does the same for any condition: a nonblocking NCCL communicator's call in
// progress (its initialisation, a group of sends and receives, its finalisation).
#include <cuda_runtime_api.h>

#include <functional>

namespace tessera::device {

void wait_stream(cudaStream_t stream, const char* what);
// Polls `done` (true: finished) as wait_stream polls a stream.
void wait_until(const std::function<bool()>& done, const char* what);

// 0: no limit; the asynchronous errors are polled all the same.
void set_wait_limit(double seconds);
double wait_limit();
// Runs between polls; throws to end the wait (one check: the NCCL communicators register theirs).
using WaitCheck = void (*)();
void set_wait_check(WaitCheck check);

}  // namespace tessera::device
