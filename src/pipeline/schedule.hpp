#pragma once
// Pipeline schedules as pure functions: (kind, stage, pp, microbatches) -> the ordered actions one
// stage performs in a training step. The executor only walks the list; unit tests check the lists
// (and a simulation of all stages together) without MPI.
//
// Per stage the list is built from compute ops, each wrapped by its point-to-point ops:
//   RecvForward(mb)  Forward(mb)  SendForward(mb)   recv on stage > 0, send on stage < pp-1
//   RecvBackward(mb) Backward(mb) SendBackward(mb)  recv on stage < pp-1, send on stage > 0
// Sends are non-blocking (MPI_Isend) and receives blocking, and each stage receives from a
// neighbour in the order that neighbour sent, so `simulate` checks exactly those semantics.
#include <string>
#include <vector>

namespace tessera {

enum class ScheduleKind {
  GPipe,     // all forwards 0..m-1, then all backwards in reverse order m-1..0
  OneFOneB,  // PipeDream-Flush / Megatron non-interleaved 1F1B; backwards in order 0..m-1
};

// Parses "gpipe" / "1f1b"; throws std::invalid_argument otherwise.
ScheduleKind parse_schedule(const std::string& name);

enum class Op {
  RecvForward,   // receive micro-batch mb's input activations from stage - 1 (never on stage 0)
  Forward,       // forward pass of micro-batch mb on this stage's layers
  SendForward,   // send mb's output activations to stage + 1 (never on the last stage)
  RecvBackward,  // receive the gradient of mb's output from stage + 1 (never on the last stage)
  Backward,      // backward pass of mb (accumulates parameter gradients)
  SendBackward,  // send the gradient of mb's input to stage - 1 (never on stage 0)
};

struct Action {
  Op op;
  int mb;
};

// The actions of stage `stage` of `pp`, in the order the executor performs them, for
// `microbatches` micro-batches. Every micro-batch is forwarded and backwarded exactly once.
// 1F1B: warmup = min(pp - stage - 1, m) forwards, then (m - warmup) steady pairs F(warmup+i) B(i),
// then warmup cooldown backwards; so stage s holds at most min(pp - s, m) activation sets.
// GPipe: F0..F(m-1) then B(m-1)..B0 (reverse order, as in the GPipe paper; gradients accumulate,
// so the order only affects which activations are freed first); every stage holds all m.
// Throws std::invalid_argument unless pp >= 1, 0 <= stage < pp and microbatches >= 1.
std::vector<Action> make_schedule(ScheduleKind kind, int stage, int pp, int microbatches);

// Largest number of micro-batches whose activations a stage holds at once under this schedule
// (forwarded, not yet backwarded): the executor allocates that many activation slots.
int max_in_flight(const std::vector<Action>& actions);

// Runs per_stage[s] (the list of stage s, pp = per_stage.size()) together: sends are buffered,
// a receive blocks until the neighbour has issued the matching send, and messages on each link and
// direction arrive in the order they were sent. Returns "" if every stage runs to completion with
// each micro-batch in [0, microbatches) forwarded and backwarded exactly once; otherwise a
// one-line description of the first problem: a deadlock (which stage waits on what), a
// neighbour sending a different micro-batch than the one expected, a Forward before its
// RecvForward, a Backward before its Forward / RecvBackward, a send before its compute, a
// Recv/Send on a stage without that neighbour, a micro-batch done twice or never.
std::string simulate(const std::vector<std::vector<Action>>& per_stage, int microbatches);

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
// partner (the message of the same number on that link and direction) is posted in the
// neighbour's current group (a rendezvous: no send is buffered, as NCCL may not buffer). Returns "" when every stage
// finishes and `simulate` accepts the lists; otherwise the first problem (a deadlock names each
// waiting stage and its group). grouped = false: every transfer alone (what the grouping avoids).
std::string simulate_grouped(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                             bool grouped = true);

// Text form for logs and tests: compute ops only, e.g. "F0 F1 B0 F2 B1 B2"; with `full` the
// point-to-point ops too, as RF/SF (recv/send forward) and RB/SB (recv/send backward):
// "F0 SF0 F1 SF1 RB0 B0 RB1 B1".
std::string to_string(const std::vector<Action>& actions, bool full = false);

}  // namespace tessera
