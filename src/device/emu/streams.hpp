#pragma once
// The CUDA emulator's streams (streams.cpp). TESSERA_EMU_STREAMS says when queued work runs:
//
//   sync (the default)  at once, when it is queued: every stream is always synchronised;
//   async[:SEED]        later: each stream is a FIFO of deferred work (kernels with their
//                       arguments captured at launch, copies, memsets, GEMMs, event edges), run
//                       only when the host must see it (a synchronising call: drain), then one
//                       item at a time from a stream drawn at random (seeded) among those whose
//                       next item may run, every cudaStreamWaitEvent edge respected.
//
// In async mode a missing event wait lets work run before what it depends on, in some seeds: the
// answer changes, and the comparisons with the CPU fail. An NCCL call runs when it is queued,
// after flush() has run everything its stream is ordered after (its queue, and through the
// events it waits on, the other streams' work up to those events), so the ranks still meet in
// their collectives in program order; work that no edge orders against it may run before or after.
#include <cuda_runtime_api.h>

#include <functional>

namespace tessera::emu {

// Queues `work` on the stream (async), or runs it now (sync).
void enqueue(cudaStream_t stream, std::function<void()> work);
// Every stream's queued work, run in the mode's order.
void drain();
// The stream's queued work and everything it waits for, run now.
void flush(cudaStream_t stream);
// cudaEventRecord and cudaStreamWaitEvent: the event marks the stream's work queued so far; a
// wait queues an edge to that mark (an event never recorded: no edge, as CUDA).
void record(cudaEvent_t event, cudaStream_t stream);
void wait_event(cudaStream_t stream, cudaEvent_t event);
// cudaEventDestroy: the event's mark is gone (edges already queued stay).
void forget_event(cudaEvent_t event);

}  // namespace tessera::emu
