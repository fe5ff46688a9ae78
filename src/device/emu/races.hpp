#pragma once
// The CUDA emulator's race detector for streams (TESSERA_EMU_RACES=on, the default, or off):
// a happens-before check over the work the host queues, as compute-sanitizer's racecheck is over
// the threads of a block, but between streams.
//
// Every stream, every recorded event and the host carry a vector clock (one count per stream).
// Queuing work on stream s ticks s's own count and joins what the host has seen complete;
// cudaEventRecord copies s's clock into the event; cudaStreamWaitEvent joins the event's clock
// into the waiting stream; a host wait (cudaStreamSynchronize, cudaStreamQuery, an event's
// synchronize or query, cudaDeviceSynchronize, cudaFree, a copy into pageable memory) joins the
// waited-for clocks into the host's. Work A happens before work B on another stream only through
// such a chain.
//
// Each byte range of device and pinned memory remembers the work that last wrote it and the last
// read of it by each stream. Work that writes a range read or written by another stream's work,
// or reads a range written by it, with no chain between the two ends the run with one line:
//
//   cuda emulator: race on buffer "gradients (fp32)" (byte 290048 of 490496): ncclAllReduce on
//   stream "overlapped collectives" reads what add_column_partials_kernel on stream "compute"
//   wrote, with no event between them
//
// The check follows the order the host queued the work in, not the order a drain ran it in, so
// it does not depend on TESSERA_EMU_STREAMS's seed: a missing edge is found in sync mode too.
//
// What each work touches: copies, memsets, cuBLAS operands and NCCL buffers their exact ranges
// (cuBLAS's C is written, and read when beta is not zero); a kernel's pointer arguments only the
// element they point at (a kernel's extent is not in its arguments), read through a `const T*`
// parameter and written through a `T*` one. So a kernel that touches another stream's range
// elsewhere than at its argument's address is not seen: an under-approximation, no false race.
// The host's own reads and writes of pinned memory are not seen either.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <initializer_list>
#include <vector>

namespace tessera::emu {

// A range the work touches, read or written.
struct Touch {
  const void* p;
  size_t bytes;
  bool write;
};

// Work queued on `stream` that touches `touches` (those outside device and pinned memory skipped).
void touch(cudaStream_t stream, const char* op, const std::vector<Touch>& touches);
void touch(cudaStream_t stream, const char* op, std::initializer_list<Touch> touches);

// The edges: cudaEventRecord, cudaStreamWaitEvent; host waits on one stream, one event, all.
void races_record(cudaEvent_t event, cudaStream_t stream);
void races_wait(cudaStream_t stream, cudaEvent_t event);
void host_waited(cudaStream_t stream);
void host_waited_event(cudaEvent_t event);
void host_waited_all();
// cudaEventDestroy: the event's clock is gone (a new event at its address starts unrecorded).
void races_forget_event(cudaEvent_t event);
// cudaFree and cudaFreeHost: the range's history ends with it.
void forget_range(const void* p, size_t bytes);

// Names for the messages: an arena's buffer (backend/arena.hpp), a stream ("compute").
void name_region(const void* p, size_t bytes, const char* name);
void name_stream(cudaStream_t stream, const char* name);

}  // namespace tessera::emu
