#pragma once
// Pipeline schedules as pure functions: (kind, stage, pp, microbatches, virtual_stages) -> the
// ordered actions one stage performs in a training step. The executor only walks the list; unit
// tests check the lists (and simulations of all stages together) without MPI.
//
// Virtual stages (Megatron's interleaved pipeline): with v = virtual_stages each stage holds v
// chunks of layers, round-robin: virtual stage k = chunk * pp + stage, so the model runs through
// stage 0..pp-1 with chunk 0, then stage 0..pp-1 with chunk 1, and so on. Activations flow to the
// next virtual stage (stage s chunk c -> stage s+1 chunk c; the last stage's chunk c -> stage 0's
// chunk c+1) and gradients the reverse way. Every action names its chunk; with v = 1 it is always 0.
// So each stage sends activations only to stage (s+1) mod pp and gradients only to (s-1) mod pp;
// with pp = 2 both kinds travel between the same two ranks, so an executor that matches
// messages by tag must keep the kinds apart, and one that matches them in order (NCCL) relies on
// the order `simulate_grouped` checks.
//
// v = 1: per stage the list is built from compute ops, each wrapped by its point-to-point ops:
//   RecvForward(mb)  Forward(mb)  SendForward(mb)   recv on stage > 0, send on stage < pp-1
//   RecvBackward(mb) Backward(mb) SendBackward(mb)  recv on stage < pp-1, send on stage > 0
// v > 1: the transfers sit as Megatron's interleaved schedule issues them (see make_schedule).
// Sends are non-blocking (MPI_Isend) and receives blocking, and each stage receives from a
// neighbour in the order that neighbour sent, so `simulate` checks exactly those semantics.
#include <string>
#include <vector>

#include "config/config.hpp"

namespace tessera {

// ScheduleKind (config/config.hpp): GPipe or 1F1B, interleaved with virtual_stages > 1.

enum class Op {
  RecvForward,   // receive (mb, chunk)'s input activations from the previous virtual stage
  Forward,       // forward pass of micro-batch mb through this stage's layers of `chunk`
  SendForward,   // send (mb, chunk)'s output activations to the next virtual stage
  RecvBackward,  // receive the gradient of (mb, chunk)'s output from the next virtual stage
  Backward,      // backward pass of (mb, chunk) (accumulates parameter gradients)
  SendBackward,  // send the gradient of (mb, chunk)'s input to the previous virtual stage
};

struct Action {
  Op op;
  int mb;
  int chunk = 0;  // the model chunk on this stage, 0 <= chunk < virtual_stages
};

// The other end of a transfer done by `stage` for its `chunk`: RecvForward / SendBackward talk to
// the previous virtual stage, SendForward / RecvBackward to the next. The peer's chunk lies
// outside [0, virtual_stages) when there is none: before stage 0 chunk 0, after stage pp-1 chunk
// v-1.
struct Peer {
  int stage;
  int chunk;
};
Peer transfer_peer(Op op, int stage, int chunk, int pp);

// The actions of stage `stage` of `pp`, in the order the executor performs them, for
// `microbatches` micro-batches. Every (micro-batch, chunk) is forwarded and backwarded exactly once.
// v = 1:
//   1F1B: warmup = min(pp - stage - 1, m) forwards, then (m - warmup) steady pairs
//   F(warmup+i) B(i), then warmup cooldown backwards; so stage s holds at most min(pp - s, m)
//   activation sets. GPipe: F0..F(m-1) then B(m-1)..B0 (reverse order, as in the GPipe paper;
//   gradients accumulate, so the order only affects which activations are freed first); every
//   stage holds all m.
// v > 1 (1F1B only), Megatron-LM's interleaved schedule:
//   The k-th forward of every stage is virtual micro-batch k: micro-batches go in groups of pp,
//   each group through chunk 0, then chunk 1, ..., chunk v-1 (backward: chunk v-1 first), so the
//   k-th forward is chunk (k mod pp*v) / pp of micro-batch (k / (pp*v)) * pp + k mod pp.
//   warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, m * v) forwards, then steady pairs
//   F(warmup+i) B(i), then cooldown backwards; stage s holds at most min(warmup + 1, m * v) chunk
//   activation sets. The transfers are Megatron's: after each warmup forward one run
//   {SendForward of it, RecvForward of the next}; after each steady pair one run {SendForward,
//   SendBackward of the pair, RecvForward, RecvBackward for the next pair}; after each cooldown
//   backward {SendBackward of it, RecvBackward of the next}; the first backward's gradient is
//   received with the last warmup run. Why not v = 1's layout (receive right before, send right
//   after each compute, warmup growing by 1 per stage): the last stage feeds stage 0, so the
//   stages form a ring, and its alternating {SendForward, RecvBackward} / {SendBackward,
//   RecvForward} runs wait on each other all around the ring under NCCL's rendezvous (a deadlock
//   for every m > pp; with pp = 2 an activation meets a gradient in NCCL's order instead). With one run per round a round of stage s meets rounds of its neighbours
//   that hold the partners, which needs stage s to run 2 rounds ahead of stage s+1: hence the 2.
//   Microbatches must be a multiple of pp (Megatron's rule): the k-th forward of stage 0 then
//   needs what stage pp-1 sent pp-1 rounds earlier, never later; with a short last group it
//   would need it sooner than the rounds allow: Megatron's rounds with a short last group
//   deadlock even with buffered sends (pp = 3, m = 4) or reach a forward before its input has
//   been received (pp = 2, m = 3), as the unit tests show. With m = k * pp the bubble is exactly
//   (pp-1)/(v*m+pp-1) (simulate_timing).
// Throws std::invalid_argument unless pp >= 1, 0 <= stage < pp, microbatches >= 1,
// virtual_stages >= 1, and for virtual_stages > 1: the 1F1B kind, pp >= 2 (one stage has nothing
// to interleave) and microbatches a multiple of pp; the message names the numbers.
std::vector<Action> make_schedule(ScheduleKind kind, int stage, int pp, int microbatches,
                                  int virtual_stages = 1);

// Largest number of (micro-batch, chunk) activation sets a stage holds at once under this
// schedule (forwarded, not yet backwarded), over all chunks.
int max_in_flight(const std::vector<Action>& actions);

// The same for one chunk: the executor keeps max_in_flight(actions, c) activation slots for chunk
// c. Within a chunk the forwards and the backwards both go in micro-batch order (GPipe's backwards
// in reverse), so the micro-batches in flight are consecutive and slot mb % max_in_flight(actions,
// c) is free whenever (mb, c) is forwarded.
int max_in_flight(const std::vector<Action>& actions, int chunk);

// Runs per_stage[s] (the list of stage s, pp = per_stage.size(), each with `virtual_stages`
// chunks) together: sends are buffered, a receive blocks until the peer (transfer_peer) has issued
// the matching send, and activations (and gradients) from one stage to another arrive in the order
// they were sent. Returns "" if every stage runs to completion with each (micro-batch, chunk) in
// [0, microbatches) x [0, virtual_stages) forwarded and backwarded exactly once; otherwise a
// one-line description of the first problem: a deadlock (which stage waits on what), a
// neighbour sending a different micro-batch or chunk than the one expected, a Forward before its
// RecvForward, a Backward before its Forward / RecvBackward, a send before its compute, a
// Recv/Send without a peer (before the first or after the last virtual stage), a micro-batch done
// twice or never.
std::string simulate(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                     int virtual_stages = 1);

// The GPU executor's view of a list. An NCCL send blocks its stream until the peer posts the
// matching receive (there is no MPI_Isend to walk on from), so a send issued alone where the
// peer first sends back would deadlock (1F1B: stage s sends F(k) and waits for B(j) while stage
// s+1 sends B(j) and waits for F(k)). The GPU executor therefore issues every run of consecutive
// transfers of the list as one ncclGroupStart/End, as Megatron's send_forward_recv_backward does:
// the groups are the list's compute actions, each alone, and its maximal runs of Recv/Send
// actions, in list order.
std::vector<std::vector<Action>> transfer_groups(const std::vector<Action>& actions);

// `simulate` with the GPU's semantics: every stage walks transfer_groups(per_stage[s]) and waits
// in each group of transfers until all of them are done; a send or receive is done only when its
// partner is posted in the neighbour's current group (a rendezvous: no send is buffered, as NCCL
// may not buffer). NCCL has no tags: the n-th message stage a sends to stage b, whatever its kind,
// meets the n-th receive b posts from a (with pp = 2 activations and gradients share the pair, so
// their order within a group matters), and must be its partner (same kind, micro-batch and
// peer chunk). Returns "" when every stage finishes and `simulate` accepts the lists; otherwise
// the first problem (a deadlock names each waiting stage and its group). grouped = false: every
// transfer alone (what the grouping avoids).
std::string simulate_grouped(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                             int virtual_stages = 1, bool grouped = true);

// A step in time units: every Forward takes forward_cost, every Backward backward_cost, transfers
// take no time, with `simulate`'s semantics (a receive waits until its send is issued; sends
// never wait). Every stage starts at 0 and the step ends when the last stage finishes.
struct StepTiming {
  std::string error;                     // "" or why the lists do not run (simulate's message)
  long length = 0;                       // the step: when the last stage finishes
  std::vector<long> busy;                // per stage: time in Forward and Backward
  std::vector<std::vector<long>> start;  // per stage, per action: when it starts (a receive:
                                         // when its message is there and the stage gets to it)
  // The stage's idle share of the step: 1 - busy / length (the pipeline bubble).
  double idle_fraction(int stage) const;
};
// With equal costs on every stage the bubble is exact: GPipe and 1F1B idle (pp-1)/(m+pp-1) of the
// step on every stage, interleaved 1F1B (pp-1)/(v*m+pp-1) (Forward and Backward then stand for
// one chunk's passes, 1/v of a stage's layers); unit tests check it for every schedule they cover.
StepTiming simulate_timing(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                           int virtual_stages = 1, int forward_cost = 1, int backward_cost = 2);

// Text form for logs and tests: compute ops only, e.g. "F0 F1 B0 F2 B1 B2"; with `full` the
// point-to-point ops too, as RF/SF (recv/send forward) and RB/SB (recv/send backward):
// "F0 SF0 F1 SF1 RB0 B0 RB1 B1". A chunk other than 0 follows the micro-batch after a dot:
// "F3.1" is micro-batch 3 on chunk 1.
std::string to_string(const std::vector<Action>& actions, bool full = false);

}  // namespace tessera
