#include "pipeline/schedule.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <stdexcept>

namespace tessera {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  throw std::invalid_argument("unknown pipeline schedule \"" + name +
                              "\" (expected \"gpipe\" or \"1f1b\")");
}

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

std::string label(const Action& a) { return op_code(a.op) + std::to_string(a.mb); }

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

}  // namespace

std::vector<Action> make_schedule(ScheduleKind kind, int stage, int pp, int microbatches) {
  if (pp < 1 || stage < 0 || stage >= pp || microbatches < 1)
    throw std::invalid_argument(
        "make_schedule: need pp >= 1, 0 <= stage < pp, microbatches >= 1 (got stage " +
        std::to_string(stage) + ", pp " + std::to_string(pp) + ", microbatches " +
        std::to_string(microbatches) + ")");
  const int m = microbatches;
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

namespace {

// What one stage has done so far, per micro-batch, while its list is simulated.
struct StageRun {
  size_t pc = 0;  // index of the next action
  std::vector<char> recv_f, fwd, sent_f, recv_b, bwd, sent_b;
};

enum class Step { Ran, Blocked, Failed };

struct Simulation {
  const std::vector<std::vector<Action>>& lists;
  int pp, m;
  std::vector<StageRun> st;
  // down[s]: activations in flight from stage s to s+1; up[s]: gradients from stage s+1 to s.
  // FIFO, like MPI's non-overtaking messages between one pair of ranks on one tag.
  std::vector<std::deque<int>> down, up;
  std::string error;

  Simulation(const std::vector<std::vector<Action>>& per_stage, int microbatches)
      : lists(per_stage), pp(int(per_stage.size())), m(microbatches), st(per_stage.size()),
        down(per_stage.size()), up(per_stage.size()) {
    for (StageRun& r : st)
      for (auto* flags : {&r.recv_f, &r.fwd, &r.sent_f, &r.recv_b, &r.bwd, &r.sent_b})
        flags->assign(m, 0);
  }

  bool done(int s) const { return st[s].pc >= lists[s].size(); }

  std::string where(int s) const {
    return "stage " + std::to_string(s) + " action " + std::to_string(st[s].pc) + " (" +
           label(lists[s][st[s].pc]) + ")";
  }

  Step fail(int s, const std::string& what) {
    error = where(s) + ": " + what;
    return Step::Failed;
  }

  // Takes mb off `q`, the link from stage `from`; blocks while nothing has been sent.
  Step receive(int s, std::deque<int>& q, int from, int mb, const char* kind) {
    if (q.empty()) return Step::Blocked;
    if (q.front() != mb)
      return fail(s, "expects the " + std::string(kind) + " of micro-batch " + std::to_string(mb) +
                         " but stage " + std::to_string(from) + " sent micro-batch " +
                         std::to_string(q.front()) + " first");
    q.pop_front();
    return Step::Ran;
  }

  // Performs stage s's next action, or reports that it blocks or breaks a rule.
  Step step(int s) {
    const Action a = lists[s][st[s].pc];
    StageRun& r = st[s];
    const int mb = a.mb;
    if (mb < 0 || mb >= m) return fail(s, "micro-batch outside [0, " + std::to_string(m) + ")");
    Step result = Step::Ran;
    switch (a.op) {
      case Op::RecvForward:
        if (s == 0) return fail(s, "stage 0 has no previous stage to receive from");
        if (r.recv_f[mb]) return fail(s, "receives micro-batch " + std::to_string(mb) + " twice");
        result = receive(s, down[s - 1], s - 1, mb, "activations");
        if (result == Step::Ran) r.recv_f[mb] = 1;
        break;
      case Op::Forward:
        if (r.fwd[mb]) return fail(s, "forwards micro-batch " + std::to_string(mb) + " twice");
        if (s > 0 && !r.recv_f[mb]) return fail(s, "Forward before its RecvForward");
        r.fwd[mb] = 1;
        break;
      case Op::SendForward:
        if (s == pp - 1) return fail(s, "the last stage has no next stage to send to");
        if (!r.fwd[mb]) return fail(s, "SendForward before its Forward");
        if (r.sent_f[mb]) return fail(s, "sends micro-batch " + std::to_string(mb) + " twice");
        down[s].push_back(mb);
        r.sent_f[mb] = 1;
        break;
      case Op::RecvBackward:
        if (s == pp - 1) return fail(s, "the last stage has no next stage to receive from");
        if (r.recv_b[mb]) return fail(s, "receives micro-batch " + std::to_string(mb) + " twice");
        result = receive(s, up[s], s + 1, mb, "gradient");
        if (result == Step::Ran) r.recv_b[mb] = 1;
        break;
      case Op::Backward:
        if (r.bwd[mb]) return fail(s, "backwards micro-batch " + std::to_string(mb) + " twice");
        if (!r.fwd[mb]) return fail(s, "Backward before its Forward");
        if (s < pp - 1 && !r.recv_b[mb]) return fail(s, "Backward before its RecvBackward");
        r.bwd[mb] = 1;
        break;
      case Op::SendBackward:
        if (s == 0) return fail(s, "stage 0 has no previous stage to send to");
        if (!r.bwd[mb]) return fail(s, "SendBackward before its Backward");
        if (r.sent_b[mb]) return fail(s, "sends micro-batch " + std::to_string(mb) + " twice");
        up[s - 1].push_back(mb);
        r.sent_b[mb] = 1;
        break;
    }
    if (result == Step::Ran) ++r.pc;
    return result;
  }

  // Every unfinished stage is blocked on a receive: say on what, and what its neighbour is doing.
  std::string deadlock() const {
    std::string msg = "deadlock:";
    const char* sep = " ";
    for (int s = 0; s < pp; ++s) {
      if (done(s)) continue;
      const int from = lists[s][st[s].pc].op == Op::RecvForward ? s - 1 : s + 1;
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
      for (int mb = 0; mb < m; ++mb) {
        if (!st[s].fwd[mb])
          return "stage " + std::to_string(s) + " never forwards micro-batch " + std::to_string(mb);
        if (!st[s].bwd[mb])
          return "stage " + std::to_string(s) + " never backwards micro-batch " +
                 std::to_string(mb);
      }
    return "";
  }
};

}  // namespace

std::string simulate(const std::vector<std::vector<Action>>& per_stage, int microbatches) {
  if (per_stage.empty()) return "no stages to simulate";
  if (microbatches < 1) return "microbatches must be >= 1, got " + std::to_string(microbatches);
  return Simulation(per_stage, microbatches).run();
}

namespace {
bool is_transfer(Op op) { return op != Op::Forward && op != Op::Backward; }
}  // namespace

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
                             bool grouped) {
  if (std::string e = simulate(per_stage, microbatches); !e.empty()) return e;
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
  // done[s][op]: transfers of kind op stage s has completed; a message's number on its link is
  // the count of that kind before it, on both ends.
  std::vector<std::array<int, 6>> done(size_t(pp), std::array<int, 6>{});
  auto current = [&](int s) -> const std::vector<Action>* {
    if (s < 0 || s >= pp || pc[size_t(s)] >= groups[size_t(s)].size()) return nullptr;
    const std::vector<Action>& g = groups[size_t(s)][pc[size_t(s)]];
    return is_transfer(g[0].op) ? &g : nullptr;
  };
  // The stage and the op kind of a transfer's partner.
  auto partner = [](int s, Op op) -> std::pair<int, Op> {
    switch (op) {
      case Op::SendForward: return {s + 1, Op::RecvForward};
      case Op::RecvForward: return {s - 1, Op::SendForward};
      case Op::SendBackward: return {s - 1, Op::RecvBackward};
      default: return {s + 1, Op::SendBackward};  // RecvBackward
    }
  };
  // Where in stage s's current group the transfer of kind op numbered n is, or -1.
  auto find = [&](int s, Op op, int n) {
    const std::vector<Action>* g = current(s);
    if (!g) return -1;
    int k = done[size_t(s)][size_t(op)];
    for (size_t i = 0; i < g->size(); ++i)
      if ((*g)[i].op == op && k++ == n) return int(i);
    return -1;
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
      std::array<int, 6> n = done[size_t(s)];
      for (size_t i = 0; i < g->size(); ++i) {
        const Action& a = (*g)[i];
        const int number = n[size_t(a.op)]++;
        if (matched[size_t(s)][i]) continue;
        const auto [peer, op] = partner(s, a.op);
        const int j = find(peer, op, number);
        if (j < 0) continue;
        const Action& b = (*current(peer))[size_t(j)];
        if (b.mb != a.mb)
          return "stage " + std::to_string(s) + " " + label(a) + " meets " + label(b) +
                 " on stage " + std::to_string(peer);
        matched[size_t(s)][i] = matched[size_t(peer)][size_t(j)] = 1;
        moved = true;
      }
    }
    for (int s = 0; s < pp; ++s) {
      const std::vector<Action>* g = current(s);
      if (!g || std::find(matched[size_t(s)].begin(), matched[size_t(s)].end(), 0) !=
                    matched[size_t(s)].end())
        continue;
      for (const Action& a : *g) ++done[size_t(s)][size_t(a.op)];
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
    if (!full && a.op != Op::Forward && a.op != Op::Backward) continue;
    if (!out.empty()) out += ' ';
    out += label(a);
  }
  return out;
}

}  // namespace tessera
