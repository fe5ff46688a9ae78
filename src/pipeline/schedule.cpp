#include "pipeline/schedule.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <stdexcept>

namespace tessera {

namespace {

const char* op_code(Op op) {
  switch (op) {
    case Op::RecvForward: return "RF";
    case Op::Forward: return "F";
    case Op::SendForward: return "SF";
    case Op::RecvBackward: return "RB";
    case Op::Backward: return "B";
    case Op::SendBackward: return "SB";
  }
  return "?";
}

std::string label(const Action& a) {
  std::string text = op_code(a.op) + std::to_string(a.mb);
  if (a.chunk != 0) {
    text += '.';
    text += std::to_string(a.chunk);
  }
  return text;
}

bool is_transfer(Op op) { return op != Op::Forward && op != Op::Backward; }

// Whether the transfer `op` of stage `stage`'s chunk has a peer (transfer_peer): false before the
// first and after the last virtual stage.
bool has_peer(Op op, int stage, int chunk, int pp, int v) {
  const int c = transfer_peer(op, stage, chunk, pp).chunk;
  return c >= 0 && c < v;
}

// The receive comes right before the compute and the send right after it: a stage never holds a
// received buffer longer than it must, and the executor can free its send buffer soonest.
void push_forward(std::vector<Action>& out, int mb, int stage, int pp) {
  if (stage > 0) out.push_back({Op::RecvForward, mb});
  out.push_back({Op::Forward, mb});
  if (stage < pp - 1) out.push_back({Op::SendForward, mb});
}

void push_backward(std::vector<Action>& out, int mb, int stage, int pp) {
  if (stage < pp - 1) out.push_back({Op::RecvBackward, mb});
  out.push_back({Op::Backward, mb});
  if (stage > 0) out.push_back({Op::SendBackward, mb});
}

// Virtual micro-batch k of the interleaved order: micro-batches in groups of pp, each group
// through every chunk (forward: 0..v-1, backward: v-1..0) before the next group starts.
Action virtual_microbatch(Op op, int k, int pp, int v) {
  const int group = k / (pp * v), in_group = k % (pp * v);
  const int chunk = in_group / pp;
  return {op, group * pp + in_group % pp, op == Op::Forward ? chunk : v - 1 - chunk};
}

// Megatron-LM's forward_backward_pipelining_with_interleaving, one stage: each round is the
// compute of a warmup forward, a steady (forward, backward) pair or a cooldown backward, then one
// run of transfers sending what the round computed and receiving what the next round needs.
std::vector<Action> interleaved(int stage, int pp, int m, int v) {
  const int total = m * v;
  const int warmup = std::min(2 * (pp - stage - 1) + (v - 1) * pp, total);
  std::vector<Action> out;
  out.reserve(size_t(6) * total);
  auto compute = [&](Op op, int k) { out.push_back(virtual_microbatch(op, k, pp, v)); };
  // The transfer of virtual micro-batch k's forward (kind Forward) or backward (kind Backward),
  // if it exists: k inside the step and a peer at that end of the chunk.
  auto transfer = [&](Op op, Op kind, int k) {
    if (k >= total) return;
    const Action a = virtual_microbatch(kind, k, pp, v);
    if (has_peer(op, stage, a.chunk, pp, v)) out.push_back({op, a.mb, a.chunk});
  };
  transfer(Op::RecvForward, Op::Forward, 0);
  for (int k = 0; k < warmup; ++k) {
    compute(Op::Forward, k);
    transfer(Op::SendForward, Op::Forward, k);
    transfer(Op::RecvForward, Op::Forward, k + 1);
    if (k == warmup - 1 && warmup < total) transfer(Op::RecvBackward, Op::Backward, 0);
  }
  // Within a run the sends come before the receives and the activations before the gradients:
  // with pp = 2 both kinds go to the same rank, and NCCL pairs them in the order they are posted.
  for (int i = 0; i < total - warmup; ++i) {
    compute(Op::Forward, warmup + i);
    compute(Op::Backward, i);
    transfer(Op::SendForward, Op::Forward, warmup + i);
    transfer(Op::SendBackward, Op::Backward, i);
    transfer(Op::RecvForward, Op::Forward, warmup + i + 1);
    transfer(Op::RecvBackward, Op::Backward, i + 1);
  }
  if (warmup == total) transfer(Op::RecvBackward, Op::Backward, 0);
  for (int k = total - warmup; k < total; ++k) {
    compute(Op::Backward, k);
    transfer(Op::SendBackward, Op::Backward, k);
    transfer(Op::RecvBackward, Op::Backward, k + 1);
  }
  return out;
}

std::string numbers(int stage, int pp, int m, int v) {
  return "(got stage " + std::to_string(stage) + ", pp " + std::to_string(pp) + ", microbatches " +
         std::to_string(m) + ", virtual_stages " + std::to_string(v) + ")";
}

}  // namespace

Peer transfer_peer(Op op, int stage, int chunk, int pp) {
  const bool previous = op == Op::RecvForward || op == Op::SendBackward;
  if (previous) return stage > 0 ? Peer{stage - 1, chunk} : Peer{pp - 1, chunk - 1};
  return stage < pp - 1 ? Peer{stage + 1, chunk} : Peer{0, chunk + 1};
}

std::vector<Action> make_schedule(ScheduleKind kind, int stage, int pp, int microbatches,
                                  int virtual_stages) {
  const int m = microbatches, v = virtual_stages;
  if (pp < 1 || stage < 0 || stage >= pp || m < 1 || v < 1)
    throw std::invalid_argument(
        "make_schedule: need pp >= 1, 0 <= stage < pp, microbatches >= 1, virtual_stages >= 1 " +
        numbers(stage, pp, m, v));
  if (v > 1) {
    if (kind != ScheduleKind::OneFOneB)
      throw std::invalid_argument(
          "make_schedule: virtual_stages > 1 is the interleaved 1F1B schedule, not GPipe " +
          numbers(stage, pp, m, v));
    if (pp < 2)
      throw std::invalid_argument(
          "make_schedule: virtual_stages > 1 needs pp >= 2, one stage has nothing to interleave " +
          numbers(stage, pp, m, v));
    if (m % pp != 0)
      throw std::invalid_argument("make_schedule: with virtual_stages " + std::to_string(v) +
                                  " microbatches must be a multiple of pp = " +
                                  std::to_string(pp) + ", got " + std::to_string(m));
    return interleaved(stage, pp, m, v);
  }
  std::vector<Action> out;
  out.reserve(size_t(6) * m);
  if (kind == ScheduleKind::GPipe) {
    for (int mb = 0; mb < m; ++mb) push_forward(out, mb, stage, pp);
    for (int mb = m - 1; mb >= 0; --mb) push_backward(out, mb, stage, pp);
    return out;
  }
  // 1F1B: the warmup fills the pipe so that stage s's first backward arrives just as its
  // (warmup+1)-th forward is done; from then on each backward frees the slot the next forward uses.
  const int warmup = std::min(pp - stage - 1, m);
  for (int mb = 0; mb < warmup; ++mb) push_forward(out, mb, stage, pp);
  for (int i = 0; i < m - warmup; ++i) {
    push_forward(out, warmup + i, stage, pp);
    push_backward(out, i, stage, pp);
  }
  for (int mb = m - warmup; mb < m; ++mb) push_backward(out, mb, stage, pp);
  return out;
}

int max_in_flight(const std::vector<Action>& actions) {
  int live = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.op == Op::Forward) peak = std::max(peak, ++live);
    if (a.op == Op::Backward) --live;
  }
  return peak;
}

int max_in_flight(const std::vector<Action>& actions, int chunk) {
  int live = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.chunk != chunk) continue;
    if (a.op == Op::Forward) peak = std::max(peak, ++live);
    if (a.op == Op::Backward) --live;
  }
  return peak;
}

namespace {

// What one stage has done so far, per (micro-batch, chunk) at mb * v + chunk, while its list is
// simulated, and when (in time units of simulate_timing).
struct StageRun {
  size_t pc = 0;  // index of the next action
  long clock = 0, busy = 0;
  std::vector<long> start;
  std::vector<char> recv_f, fwd, sent_f, recv_b, bwd, sent_b;
};

// A message in flight: what the sender sent and when.
struct Message {
  int mb, chunk;
  long time;
};

enum class Step { Ran, Blocked, Failed };

struct Simulation {
  const std::vector<std::vector<Action>>& lists;
  int pp, m, v;
  long forward_cost, backward_cost;
  std::vector<StageRun> st;
  // down[s]: activations in flight from stage s to stage (s+1) mod pp; up[s]: gradients from
  // stage s to (s-1) mod pp. FIFO, like MPI's non-overtaking messages between one pair of ranks
  // on one tag.
  std::vector<std::deque<Message>> down, up;
  std::string error;

  Simulation(const std::vector<std::vector<Action>>& per_stage, int microbatches, int chunks,
             long f_cost = 1, long b_cost = 2)
      : lists(per_stage), pp(int(per_stage.size())), m(microbatches), v(chunks),
        forward_cost(f_cost), backward_cost(b_cost), st(per_stage.size()), down(per_stage.size()),
        up(per_stage.size()) {
    for (size_t s = 0; s < st.size(); ++s) {
      StageRun& r = st[s];
      r.start.assign(lists[s].size(), 0);
      for (auto* flags : {&r.recv_f, &r.fwd, &r.sent_f, &r.recv_b, &r.bwd, &r.sent_b})
        flags->assign(size_t(m) * v, 0);
    }
  }

  bool done(int s) const { return st[s].pc >= lists[s].size(); }

  std::string where(int s) const {
    return "stage " + std::to_string(s) + " action " + std::to_string(st[s].pc) + " (" +
           label(lists[s][st[s].pc]) + ")";
  }

  // "micro-batch 3", with v > 1 "micro-batch 3 chunk 1".
  std::string item(int mb, int chunk) const {
    std::string text = "micro-batch " + std::to_string(mb);
    if (v > 1) text += " chunk " + std::to_string(chunk);
    return text;
  }

  Step fail(int s, const std::string& what) {
    error = where(s) + ": " + what;
    return Step::Failed;
  }

  // Takes the expected message off `q`, the link from stage `from`; blocks while nothing has been
  // sent. `chunk` is the sender's chunk.
  Step receive(int s, std::deque<Message>& q, int from, int mb, int chunk, const char* kind) {
    if (q.empty()) return Step::Blocked;
    const Message& front = q.front();
    if (front.mb != mb || front.chunk != chunk)
      return fail(s, "expects the " + std::string(kind) + " of " + item(mb, chunk) + " but stage " +
                         std::to_string(from) + " sent " + item(front.mb, front.chunk) +
                         " first");
    st[s].clock = std::max(st[s].clock, front.time);
    q.pop_front();
    return Step::Ran;
  }

  // The stage without a peer for this transfer, in words.
  std::string no_peer(int s, int chunk, bool previous) const {
    if (v == 1)
      return previous ? "stage 0 has no previous stage" : "the last stage has no next stage";
    return "stage " + std::to_string(s) + " chunk " + std::to_string(chunk) +
           (previous ? " (the first virtual stage) has no previous stage"
                     : " (the last virtual stage) has no next stage");
  }

  // Performs stage s's next action, or reports that it blocks or breaks a rule.
  Step step(int s) {
    const Action a = lists[s][st[s].pc];
    StageRun& r = st[s];
    const int mb = a.mb, c = a.chunk;
    if (mb < 0 || mb >= m) return fail(s, "micro-batch outside [0, " + std::to_string(m) + ")");
    if (c < 0 || c >= v) return fail(s, "chunk outside [0, " + std::to_string(v) + ")");
    const size_t at = size_t(mb) * v + c;
    const Peer peer = transfer_peer(a.op, s, c, pp);
    const bool peered = has_peer(a.op, s, c, pp, v);
    const std::string what = item(mb, c);
    const long now = r.clock;  // a receive moves the clock; it starts when the message is there
    Step result = Step::Ran;
    switch (a.op) {
      case Op::RecvForward:
        if (!peered) return fail(s, no_peer(s, c, true) + " to receive from");
        if (r.recv_f[at]) return fail(s, "receives " + what + " twice");
        result = receive(s, down[peer.stage], peer.stage, mb, peer.chunk, "activations");
        if (result == Step::Ran) r.recv_f[at] = 1;
        break;
      case Op::Forward:
        if (r.fwd[at]) return fail(s, "forwards " + what + " twice");
        if (has_peer(Op::RecvForward, s, c, pp, v) && !r.recv_f[at])
          return fail(s, "Forward before its RecvForward");
        r.fwd[at] = 1;
        r.clock += forward_cost;
        r.busy += forward_cost;
        break;
      case Op::SendForward:
        if (!peered) return fail(s, no_peer(s, c, false) + " to send to");
        if (!r.fwd[at]) return fail(s, "SendForward before its Forward");
        if (r.sent_f[at]) return fail(s, "sends " + what + " twice");
        down[s].push_back({mb, c, r.clock});
        r.sent_f[at] = 1;
        break;
      case Op::RecvBackward:
        if (!peered) return fail(s, no_peer(s, c, false) + " to receive from");
        if (r.recv_b[at]) return fail(s, "receives " + what + " twice");
        result = receive(s, up[peer.stage], peer.stage, mb, peer.chunk, "gradient");
        if (result == Step::Ran) r.recv_b[at] = 1;
        break;
      case Op::Backward:
        if (r.bwd[at]) return fail(s, "backwards " + what + " twice");
        if (!r.fwd[at]) return fail(s, "Backward before its Forward");
        if (has_peer(Op::RecvBackward, s, c, pp, v) && !r.recv_b[at])
          return fail(s, "Backward before its RecvBackward");
        r.bwd[at] = 1;
        r.clock += backward_cost;
        r.busy += backward_cost;
        break;
      case Op::SendBackward:
        if (!peered) return fail(s, no_peer(s, c, true) + " to send to");
        if (!r.bwd[at]) return fail(s, "SendBackward before its Backward");
        if (r.sent_b[at]) return fail(s, "sends " + what + " twice");
        up[s].push_back({mb, c, r.clock});
        r.sent_b[at] = 1;
        break;
    }
    if (result == Step::Ran) {
      r.start[r.pc] = is_transfer(a.op) ? r.clock : now;
      ++r.pc;
    }
    return result;
  }

  // Every unfinished stage is blocked on a receive: say on what, and what its peer is doing.
  std::string deadlock() const {
    std::string msg = "deadlock:";
    const char* sep = " ";
    for (int s = 0; s < pp; ++s) {
      if (done(s)) continue;
      const Action& a = lists[s][st[s].pc];
      const int from = transfer_peer(a.op, s, a.chunk, pp).stage;
      msg += sep + where(s) + " waits for stage " + std::to_string(from) + ", which " +
             (done(from) ? std::string("has finished")
                         : "is at action " + std::to_string(st[from].pc) + " (" +
                               label(lists[from][st[from].pc]) + ")");
      sep = "; ";
    }
    return msg;
  }

  std::string run() {
    while (true) {
      bool progressed = false, all_done = true;
      for (int s = 0; s < pp; ++s) {
        while (!done(s)) {
          const Step result = step(s);
          if (result == Step::Failed) return error;
          if (result == Step::Blocked) break;
          progressed = true;
        }
        all_done = all_done && done(s);
      }
      if (all_done) break;
      if (!progressed) return deadlock();
    }
    // Every stage ran to the end; check it did all the work. Each Forward / Backward needs its own
    // receive, each receive takes one message and each send is unique, so all work done also
    // means every message sent was received.
    for (int s = 0; s < pp; ++s)
      for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < v; ++c) {
          const size_t at = size_t(mb) * v + c;
          if (!st[s].fwd[at])
            return "stage " + std::to_string(s) + " never forwards " + item(mb, c);
          if (!st[s].bwd[at])
            return "stage " + std::to_string(s) + " never backwards " + item(mb, c);
        }
    return "";
  }
};

std::string check_arguments(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                            int virtual_stages) {
  if (per_stage.empty()) return "no stages to simulate";
  if (microbatches < 1) return "microbatches must be >= 1, got " + std::to_string(microbatches);
  if (virtual_stages < 1)
    return "virtual_stages must be >= 1, got " + std::to_string(virtual_stages);
  return "";
}

}  // namespace

std::string simulate(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                     int virtual_stages) {
  if (std::string e = check_arguments(per_stage, microbatches, virtual_stages); !e.empty())
    return e;
  return Simulation(per_stage, microbatches, virtual_stages).run();
}

double StepTiming::idle_fraction(int stage) const {
  return length > 0 ? 1.0 - double(busy[size_t(stage)]) / double(length) : 0.0;
}

StepTiming simulate_timing(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                           int virtual_stages, int forward_cost, int backward_cost) {
  StepTiming t;
  t.error = check_arguments(per_stage, microbatches, virtual_stages);
  if (t.error.empty() && (forward_cost < 0 || backward_cost < 0))
    t.error = "costs must be >= 0, got forward " + std::to_string(forward_cost) + ", backward " +
              std::to_string(backward_cost);
  if (!t.error.empty()) return t;
  // Each stage's clock depends only on its own list and the send times of what it receives, so
  // the order in which run() interleaves the stages does not change the times.
  Simulation sim(per_stage, microbatches, virtual_stages, forward_cost, backward_cost);
  t.error = sim.run();
  if (!t.error.empty()) return t;
  for (const StageRun& r : sim.st) {
    t.length = std::max(t.length, r.clock);
    t.busy.push_back(r.busy);
    t.start.push_back(r.start);
  }
  return t;
}

std::vector<std::vector<Action>> transfer_groups(const std::vector<Action>& actions) {
  std::vector<std::vector<Action>> groups;
  for (const Action& a : actions) {
    const bool joins = is_transfer(a.op) && !groups.empty() && is_transfer(groups.back()[0].op);
    if (joins) groups.back().push_back(a);
    else groups.push_back({a});
  }
  return groups;
}

std::string simulate_grouped(const std::vector<std::vector<Action>>& per_stage, int microbatches,
                             int virtual_stages, bool grouped) {
  if (std::string e = simulate(per_stage, microbatches, virtual_stages); !e.empty()) return e;
  const int pp = int(per_stage.size());
  std::vector<std::vector<std::vector<Action>>> groups(static_cast<size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    if (grouped) {
      groups[size_t(s)] = transfer_groups(per_stage[size_t(s)]);
      continue;
    }
    for (const Action& a : per_stage[size_t(s)]) groups[size_t(s)].push_back({a});
  }
  std::vector<size_t> pc(size_t(pp), 0);
  // sent[s][p] / received[s][p]: messages stage s has sent to / received from stage p in its
  // completed groups. NCCL matches the n-th send from a to b with the n-th receive on b from a.
  std::vector<std::vector<int>> sent(size_t(pp), std::vector<int>(size_t(pp), 0));
  std::vector<std::vector<int>> received = sent;
  auto current = [&](int s) -> const std::vector<Action>* {
    if (pc[size_t(s)] >= groups[size_t(s)].size()) return nullptr;
    const std::vector<Action>& g = groups[size_t(s)][pc[size_t(s)]];
    return is_transfer(g[0].op) ? &g : nullptr;
  };
  auto is_send = [](Op op) { return op == Op::SendForward || op == Op::SendBackward; };
  auto peer_of = [&](int s, const Action& a) { return transfer_peer(a.op, s, a.chunk, pp).stage; };
  // The number of transfer i of stage s's current group on its (direction, peer) channel.
  auto number = [&](int s, size_t i) {
    const std::vector<Action>& g = *current(s);
    const int p = peer_of(s, g[i]);
    const bool send = is_send(g[i].op);
    int n = (send ? sent : received)[size_t(s)][size_t(p)];
    for (size_t j = 0; j < i; ++j)
      n += is_send(g[j].op) == send && peer_of(s, g[j]) == p;
    return n;
  };
  // Where in stage p's current group the transfer numbered n from (send) or to stage s is, or -1.
  auto find = [&](int p, int s, bool send, int n) {
    const std::vector<Action>* g = current(p);
    if (!g) return -1;
    for (size_t j = 0; j < g->size(); ++j)
      if (is_send((*g)[j].op) == send && peer_of(p, (*g)[j]) == s && number(p, j) == n)
        return int(j);
    return -1;
  };
  auto partner_op = [](Op op) {
    switch (op) {
      case Op::SendForward: return Op::RecvForward;
      case Op::RecvForward: return Op::SendForward;
      case Op::SendBackward: return Op::RecvBackward;
      default: return Op::SendBackward;  // RecvBackward
    }
  };
  // matched[s][i]: transfer i of stage s's current group has met its partner.
  std::vector<std::vector<char>> matched(static_cast<size_t>(pp));
  for (;;) {
    bool moved = false, finished = true;
    for (int s = 0; s < pp; ++s) {
      while (pc[size_t(s)] < groups[size_t(s)].size() && !current(s)) {  // compute runs freely
        ++pc[size_t(s)];
        moved = true;
      }
      if (const std::vector<Action>* g = current(s); g && matched[size_t(s)].empty())
        matched[size_t(s)].assign(g->size(), 0);
    }
    // A transfer completes when its partner is posted too (both groups launched); a group ends
    // when all of its transfers have.
    for (int s = 0; s < pp; ++s) {
      const std::vector<Action>* g = current(s);
      if (!g) continue;
      finished = false;
      for (size_t i = 0; i < g->size(); ++i) {
        if (matched[size_t(s)][i]) continue;
        const Action& a = (*g)[i];
        const int p = peer_of(s, a);
        const int j = find(p, s, !is_send(a.op), number(s, i));
        if (j < 0) continue;
        const Action& b = (*current(p))[size_t(j)];
        if (b.op != partner_op(a.op) || b.mb != a.mb ||
            b.chunk != transfer_peer(a.op, s, a.chunk, pp).chunk)
          return "stage " + std::to_string(s) + " " + label(a) + " meets " + label(b) +
                 " on stage " + std::to_string(p);
        matched[size_t(s)][i] = matched[size_t(p)][size_t(j)] = 1;
        moved = true;
      }
    }
    for (int s = 0; s < pp; ++s) {
      const std::vector<Action>* g = current(s);
      if (!g || std::find(matched[size_t(s)].begin(), matched[size_t(s)].end(), 0) !=
                    matched[size_t(s)].end())
        continue;
      for (const Action& a : *g)
        ++(is_send(a.op) ? sent : received)[size_t(s)][size_t(peer_of(s, a))];
      ++pc[size_t(s)];
      matched[size_t(s)].clear();
      moved = true;
    }
    if (finished) return "";
    if (!moved) {
      std::string e = "deadlock:";
      for (int s = 0; s < pp; ++s) {
        const std::vector<Action>* g = current(s);
        if (!g) continue;
        e += " stage " + std::to_string(s) + " waits in {";
        for (const Action& a : *g) {
          if (&a != &g->front()) e += ' ';
          e += label(a);
        }
        e += "}";
      }
      return e;
    }
  }
}

std::string to_string(const std::vector<Action>& actions, bool full) {
  std::string out;
  for (const Action& a : actions) {
    if (!full && is_transfer(a.op)) continue;
    if (!out.empty()) out += ' ';
    out += label(a);
  }
  return out;
}

}  // namespace tessera
