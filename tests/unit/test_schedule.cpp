// Pipeline schedules without MPI: every generated list for pp 1..8, m 1..12 and both kinds does
// each micro-batch's work once in a legal order, has the 1F1B phase lengths and activation
// footprint of Megatron's schedule, and runs to completion under `simulate`; hand-broken lists make
// `simulate` fail with a message naming the problem. Interleaved 1F1B (v = 2..4 chunks per stage,
// pp 2..8, every m = k * pp up to 16) equals a transcription of Megatron-LM's rounds, completes
// under both simulators, sends every micro-batch through the virtual stages in order, and idles
// exactly (pp-1)/(v*m+pp-1) of the step (GPipe and 1F1B: (pp-1)/(m+pp-1)).
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipeline/executor.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};

std::vector<std::vector<Action>> all_stages(ScheduleKind kind, int pp, int m) {
  std::vector<std::vector<Action>> out;
  for (int s = 0; s < pp; ++s) out.push_back(make_schedule(kind, s, pp, m));
  return out;
}

// The compute ops only, as (op, mb) pairs.
std::vector<Action> compute_ops(const std::vector<Action>& actions) {
  std::vector<Action> out;
  for (const Action& a : actions)
    if (a.op == Op::Forward || a.op == Op::Backward) out.push_back(a);
  return out;
}

// "F3": built by appending (g++ 12 -O3 misreads "F" + std::to_string(i) as an overlapping memcpy).
std::string op_text(char kind, int i) {
  std::string text(1, kind);
  text += std::to_string(i);
  return text;
}

// Megatron's non-interleaved 1F1B for stage s, written out independently of make_schedule:
// `warmup` forwards, `m - warmup` (forward, backward) pairs, `warmup` backwards.
std::string expected_1f1b(int s, int pp, int m) {
  const int warmup = std::min(pp - s - 1, m);
  std::vector<std::string> ops;
  for (int i = 0; i < warmup; ++i) ops.push_back(op_text('F', i));
  for (int i = 0; i < m - warmup; ++i) {
    ops.push_back(op_text('F', warmup + i));
    ops.push_back(op_text('B', i));
  }
  for (int i = m - warmup; i < m; ++i) ops.push_back(op_text('B', i));
  std::string out;
  for (const std::string& op : ops) out += (out.empty() ? "" : " ") + op;
  return out;
}

bool same(const Action& a, Op op, int mb) { return a.op == op && a.mb == mb; }

TEST(Schedule, MakeScheduleRejectsBadArguments) {
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 0, 0, 4), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, -1, 2, 4), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::GPipe, 2, 2, 4), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::GPipe, 0, 2, 0), std::invalid_argument);
}

TEST(Schedule, ToStringExactText) {
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 2, 3)), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 1, 2, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::GPipe, 0, 2, 3)), "F0 F1 F2 B2 B1 B0");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 2, 2), true),
            "F0 SF0 F1 SF1 RB0 B0 RB1 B1");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 1, 2, 2), true),
            "RF0 F0 B0 SB0 RF1 F1 B1 SB1");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::GPipe, 1, 3, 2), true),
            "RF0 F0 SF0 RF1 F1 SF1 RB1 B1 SB1 RB0 B0 SB0");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 1, 3), true), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::GPipe, 0, 1, 3), true), "F0 F1 F2 B2 B1 B0");
  EXPECT_EQ(to_string({}), "");
}

TEST(Schedule, OneFOneBPhases) {
  // pp=4, m=8: stage 0 has 3 warmup forwards, 5 steady pairs, 3 cooldown backwards.
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 4, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 2, 4, 8)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  // The last stage has no warmup.
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 3, 4, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than the warmup wants: all forwards, then all backwards in order.
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 8, 3)), "F0 F1 F2 B0 B1 B2");

  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < pp; ++s) {
        SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                     " stage=" + std::to_string(s));
        const std::vector<Action> ops =
            compute_ops(make_schedule(ScheduleKind::OneFOneB, s, pp, m));
        EXPECT_EQ(to_string(ops), expected_1f1b(s, pp, m));
        // Phase lengths read back off the list: leading forwards, trailing backwards, and the
        // strictly alternating middle.
        const int warmup = std::min(pp - s - 1, m);
        int leading_f = 0, trailing_b = 0;
        while (leading_f < int(ops.size()) && ops[leading_f].op == Op::Forward) ++leading_f;
        while (trailing_b < int(ops.size()) && ops[ops.size() - 1 - trailing_b].op == Op::Backward)
          ++trailing_b;
        if (warmup < m) {
          EXPECT_EQ(leading_f, warmup + 1);   // the first steady pair starts with a forward
          EXPECT_EQ(trailing_b, warmup + 1);  // and the last one ends with a backward
          const int steady_pairs = (int(ops.size()) - 2 * warmup) / 2;
          EXPECT_EQ(steady_pairs, m - warmup);
          for (int i = 0; i < steady_pairs; ++i) {
            EXPECT_EQ(ops[warmup + 2 * i].op, Op::Forward);
            EXPECT_EQ(ops[warmup + 2 * i + 1].op, Op::Backward);
          }
        } else {
          EXPECT_EQ(leading_f, m);
          EXPECT_EQ(trailing_b, m);
        }
      }
}

TEST(Schedule, EveryMicroBatchOnceInLegalOrder) {
  for (ScheduleKind kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 12; ++m)
        for (int s = 0; s < pp; ++s) {
          SCOPED_TRACE(std::string(kind == ScheduleKind::GPipe ? "gpipe" : "1f1b") +
                       " pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                       " stage=" + std::to_string(s));
          const std::vector<Action> a = make_schedule(kind, s, pp, m);
          std::vector<int> forward_at(m, -1), backward_at(m, -1);
          std::vector<int> forward_order, backward_order;
          int recv_f = 0, send_f = 0, recv_b = 0, send_b = 0;
          const int n = int(a.size());
          for (int i = 0; i < n; ++i) {
            ASSERT_GE(a[i].mb, 0);
            ASSERT_LT(a[i].mb, m);
            const int mb = a[i].mb;
            switch (a[i].op) {
              case Op::Forward:
                EXPECT_EQ(forward_at[mb], -1) << "forwarded twice: " << mb;
                forward_at[mb] = i;
                forward_order.push_back(mb);
                // Wrapped by its receive (stage > 0) and its send (stage < pp-1), right next to it.
                EXPECT_TRUE(s == 0 || (i > 0 && same(a[i - 1], Op::RecvForward, mb))) << i;
                EXPECT_TRUE(s == pp - 1 || (i + 1 < n && same(a[i + 1], Op::SendForward, mb))) << i;
                break;
              case Op::Backward:
                EXPECT_EQ(backward_at[mb], -1) << "backwarded twice: " << mb;
                backward_at[mb] = i;
                backward_order.push_back(mb);
                EXPECT_TRUE(s == pp - 1 || (i > 0 && same(a[i - 1], Op::RecvBackward, mb))) << i;
                EXPECT_TRUE(s == 0 || (i + 1 < n && same(a[i + 1], Op::SendBackward, mb))) << i;
                break;
              case Op::RecvForward: ++recv_f; break;
              case Op::SendForward: ++send_f; break;
              case Op::RecvBackward: ++recv_b; break;
              case Op::SendBackward: ++send_b; break;
            }
          }
          for (int mb = 0; mb < m; ++mb) {
            EXPECT_GE(forward_at[mb], 0) << "never forwarded: " << mb;
            EXPECT_GT(backward_at[mb], forward_at[mb]) << "backward not after forward: " << mb;
          }
          // Point-to-point ops only where the neighbour exists, and one per compute op (with the
          // adjacency above, none is stray).
          EXPECT_EQ(recv_f, s > 0 ? m : 0);
          EXPECT_EQ(send_b, s > 0 ? m : 0);
          EXPECT_EQ(send_f, s < pp - 1 ? m : 0);
          EXPECT_EQ(recv_b, s < pp - 1 ? m : 0);
          EXPECT_EQ(n, 2 * m + 2 * m * ((s > 0) + (s < pp - 1)));
          // Forwards in order; backwards in order for 1F1B, reversed for GPipe.
          std::vector<int> up(m), down(m);
          for (int mb = 0; mb < m; ++mb) up[mb] = mb, down[mb] = m - 1 - mb;
          EXPECT_EQ(forward_order, up);
          EXPECT_EQ(backward_order, kind == ScheduleKind::GPipe ? down : up);
        }
}

TEST(Schedule, MaxInFlight) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < pp; ++s) {
        SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                     " stage=" + std::to_string(s));
        EXPECT_EQ(max_in_flight(make_schedule(ScheduleKind::OneFOneB, s, pp, m)),
                  std::min(pp - s, m));
        EXPECT_EQ(max_in_flight(make_schedule(ScheduleKind::GPipe, s, pp, m)), m);
      }
  EXPECT_EQ(max_in_flight({}), 0);
  // Counts forwarded-not-yet-backwarded, wherever the peak falls.
  EXPECT_EQ(max_in_flight({{Op::Forward, 0},
                           {Op::Backward, 0},
                           {Op::Forward, 1},
                           {Op::Forward, 2},
                           {Op::Backward, 1},
                           {Op::Forward, 3},
                           {Op::Backward, 2},
                           {Op::Backward, 3}}),
            2);
}

TEST(Schedule, SimulateAcceptsEveryGeneratedSchedule) {
  for (ScheduleKind kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 12; ++m)
        EXPECT_EQ(simulate(all_stages(kind, pp, m), m), "")
            << (kind == ScheduleKind::GPipe ? "gpipe" : "1f1b") << " pp=" << pp << " m=" << m;
}

// The GPU executor's grouping (NCCL sends block until matched): every generated schedule still
// completes when each run of consecutive transfers is one group and nothing is buffered.
TEST(Schedule, GroupedTransfersCompleteForEveryGeneratedSchedule) {
  for (ScheduleKind kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 12; ++m)
        EXPECT_EQ(simulate_grouped(all_stages(kind, pp, m), m), "")
            << (kind == ScheduleKind::GPipe ? "gpipe" : "1f1b") << " pp=" << pp << " m=" << m;
}

TEST(Schedule, TransferGroupsAreRunsOfConsecutiveTransfers) {
  const auto g = transfer_groups(make_schedule(ScheduleKind::OneFOneB, 1, 3, 3));
  std::string text;
  for (const auto& group : g) {
    text += '[';
    text += to_string(group, true);
    text += ']';
  }
  EXPECT_EQ(text, "[RF0][F0][SF0 RF1][F1][SF1 RB0][B0][SB0 RF2][F2][SF2 RB1][B1][SB1 RB2][B2][SB2]");
}

// Without the grouping 1F1B deadlocks under NCCL's rendezvous: stage 0 sends F1 while stage 1
// sends B0, each waiting for the other's receive (buffered sends, as MPI's, run).
TEST(Schedule, UngroupedTransfersDeadlockOneFOneB) {
  const auto stages = all_stages(ScheduleKind::OneFOneB, 2, 2);
  ASSERT_EQ(simulate(stages, 2), "");
  EXPECT_EQ(simulate_grouped(stages, 2, /*virtual_stages=*/1, /*grouped=*/false),
            "deadlock: stage 0 waits in {SF1} stage 1 waits in {SB0}");
  EXPECT_EQ(simulate_grouped(stages, 2), "");
}

// Expects simulate to fail with a message containing every one of `parts`.
void expect_failure(const std::vector<std::vector<Action>>& stages, int m,
                    const std::vector<std::string>& parts) {
  const std::string message = simulate(stages, m);
  ASSERT_NE(message, "");
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(Schedule, SimulateRejectsSwappedBackwards) {
  // GPipe stage 0 of pp=3 receives gradients 3, 2 in that order; swapping its (RB, B) groups for
  // micro-batches 3 and 2 makes it expect 2 while stage 1 sent 3 first.
  auto stages = all_stages(ScheduleKind::GPipe, 3, 4);
  std::vector<Action>& s0 = stages[0];
  ASSERT_EQ(to_string(s0, true), "F0 SF0 F1 SF1 F2 SF2 F3 SF3 RB3 B3 RB2 B2 RB1 B1 RB0 B0");
  std::swap(s0[8], s0[10]);
  std::swap(s0[9], s0[11]);
  expect_failure(stages, 4, {"stage 0", "RB2", "micro-batch 2", "stage 1 sent micro-batch 3"});

  // The same on a middle stage of 1F1B: stage 1 sends gradients in an order stage 0 does not
  // expect.
  stages = all_stages(ScheduleKind::OneFOneB, 3, 4);
  std::vector<Action>& s1 = stages[1];
  // Cooldown groups RB2 B2 SB2 and RB3 B3 SB3 are the last six actions.
  ASSERT_EQ(to_string({s1.end() - 6, s1.end()}, true), "RB2 B2 SB2 RB3 B3 SB3");
  std::swap_ranges(s1.end() - 6, s1.end() - 3, s1.end() - 3);
  expect_failure(stages, 4,
                 {"stage 1", "(RB3)", "expects the gradient of micro-batch 3",
                  "stage 2 sent micro-batch 2 first"});
}

TEST(Schedule, SimulateRejectsStageThatNeverSends) {
  auto stages = all_stages(ScheduleKind::OneFOneB, 3, 4);
  std::vector<Action> kept;
  for (const Action& a : stages[0])
    if (a.op != Op::SendForward) kept.push_back(a);
  stages[0] = kept;
  expect_failure(stages, 4, {"deadlock", "stage 1 action 0 (RF0) waits for stage 0"});

  // The last stage never sends gradients back: stage 1 blocks on RB0 while stage 2 has finished.
  stages = all_stages(ScheduleKind::GPipe, 3, 2);
  kept.clear();
  for (const Action& a : stages[2])
    if (a.op != Op::SendBackward) kept.push_back(a);
  stages[2] = kept;
  expect_failure(stages, 2, {"deadlock", "waits for stage 2, which has finished"});
}

TEST(Schedule, SimulateRejectsForwardBeforeItsRecv) {
  auto stages = all_stages(ScheduleKind::OneFOneB, 2, 3);
  ASSERT_TRUE(same(stages[1][0], Op::RecvForward, 0));
  std::swap(stages[1][0], stages[1][1]);
  expect_failure(stages, 3, {"stage 1 action 0 (F0)", "Forward before its RecvForward"});
}

TEST(Schedule, SimulateRejectsOtherBrokenLists) {
  const int m = 2;
  // A receive before the send it waits for, on both sides: a cycle.
  expect_failure(
      {{{Op::Forward, 0}, {Op::RecvBackward, 0}, {Op::SendForward, 0}, {Op::Backward, 0}},
       {{Op::RecvForward, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendBackward, 0}}},
      1,
      {"deadlock", "stage 0 action 1 (RB0) waits for stage 1",
       "stage 1 action 0 (RF0) waits for stage 0"});
  // A receive out of order with the neighbour's sends.
  auto stages = all_stages(ScheduleKind::OneFOneB, 2, m);
  stages[1].insert(stages[1].begin(), Action{Op::RecvForward, 1});
  expect_failure(stages, m, {"expects the activations of micro-batch 1", "sent micro-batch 0"});
  // Recv/Send on a stage without that neighbour.
  stages = all_stages(ScheduleKind::GPipe, 2, m);
  stages[0].insert(stages[0].begin(), Action{Op::RecvForward, 0});
  expect_failure(stages, m, {"stage 0 has no previous stage"});
  stages = all_stages(ScheduleKind::GPipe, 2, m);
  stages[1].push_back({Op::SendForward, 1});
  expect_failure(stages, m, {"last stage has no next stage"});
  // Backward before its Forward; Backward before its RecvBackward; send before compute.
  expect_failure({{{Op::Backward, 0}, {Op::Forward, 0}}}, 1, {"Backward before its Forward"});
  stages = all_stages(ScheduleKind::GPipe, 2, m);
  std::swap(stages[0][4], stages[0][5]);  // RB1 B1 -> B1 RB1
  expect_failure(stages, m, {"Backward before its RecvBackward"});
  stages = all_stages(ScheduleKind::GPipe, 2, m);
  std::swap(stages[0][0], stages[0][1]);  // F0 SF0 -> SF0 F0
  expect_failure(stages, m, {"SendForward before its Forward"});
  // A micro-batch never backwarded, one done twice, one out of range.
  expect_failure({{{Op::Forward, 0}, {Op::Forward, 1}, {Op::Backward, 1}}}, 2,
                 {"never backwards micro-batch 0"});
  expect_failure({{{Op::Forward, 0}, {Op::Forward, 0}}}, 1, {"forwards micro-batch 0 twice"});
  expect_failure({{{Op::Forward, 2}}}, 2, {"outside [0, 2)"});
  // A message sent twice.
  stages = all_stages(ScheduleKind::OneFOneB, 2, m);
  stages[0].insert(stages[0].begin() + 2, Action{Op::SendForward, 0});
  expect_failure(stages, m, {"sends micro-batch 0 twice"});
  // Arguments.
  EXPECT_NE(simulate({}, 1), "");
  EXPECT_NE(simulate(all_stages(ScheduleKind::GPipe, 2, 1), 0), "");
}


// ---- Interleaved 1F1B (virtual stages) ----

struct Layout {
  int pp, v, m;
};

// Every layout the interleaved tests cover: pp 2..8, v 2..4, every m = k * pp up to 16.
std::vector<Layout> interleaved_layouts() {
  std::vector<Layout> out;
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 16; m += pp) out.push_back({pp, v, m});
  return out;
}

std::string name(const Layout& l) {
  std::string text = "pp=";  // appended, not "pp=" + ... (see op_text)
  text += std::to_string(l.pp) + " v=" + std::to_string(l.v) + " m=" + std::to_string(l.m);
  return text;
}

std::vector<std::vector<Action>> interleaved_stages(const Layout& l) {
  std::vector<std::vector<Action>> out;
  for (int s = 0; s < l.pp; ++s)
    out.push_back(make_schedule(ScheduleKind::OneFOneB, s, l.pp, l.m, l.v));
  return out;
}

// Megatron-LM's forward_backward_pipelining_with_interleaving for stage s, transcribed in its own
// terms, independently of make_schedule: the schedule table (groups of pp micro-batches, each
// through every chunk; a short last group when pp does not divide m), get_model_chunk_id with
// Python's modulo, the warmup 2 * (pp - s - 1) + (v - 1) * pp, and per round the recv_prev /
// recv_next flags, with the "first stage is ahead of the last by pp - 1" rule of the steady state.
// A received tensor goes to its chunk's queue, so it is the chunk's next micro-batch. Within a
// round the sends come first, then the receives, activations before gradients (Megatron's p2p
// batches post them to each peer in that order).
std::vector<Action> megatron_interleaved(int s, int pp, int m, int v) {
  const int total = m * v;
  std::vector<int> table_mb, table_chunk;
  for (int first_mb = 0; first_mb < m; first_mb += pp)
    for (int c = 0; c < v; ++c)
      for (int mb = first_mb; mb < std::min(first_mb + pp, m); ++mb) {
        table_mb.push_back(mb);
        table_chunk.push_back(c);
      }
  auto at = [&](int k) { return ((k % total) + total) % total; };
  auto chunk_id = [&](int k, bool forward) {
    const int c = table_chunk[size_t(at(k))];
    return forward ? c : v - 1 - c;
  };
  auto mb_id = [&](int k) { return table_mb[size_t(at(k))]; };
  const bool first = s == 0, last = s == pp - 1;
  int warmup = 2 * (pp - s - 1) + (v - 1) * pp;
  const bool all_warmup = warmup >= total;
  if (all_warmup) warmup = total;
  const int remaining = total - warmup;
  std::vector<Action> out;
  std::vector<int> received_f(size_t(v), 0), received_b(size_t(v), 0);
  auto recv_prev = [&](int c) { out.push_back({Op::RecvForward, received_f[size_t(c)]++, c}); };
  auto recv_next = [&](int c) { out.push_back({Op::RecvBackward, received_b[size_t(c)]++, c}); };
  if (!first) recv_prev(0);
  for (int k = 0; k < warmup; ++k) {
    const int c = chunk_id(k, true);
    out.push_back({Op::Forward, mb_id(k), c});
    const int next_c = chunk_id(k + 1, true);
    const bool recv = !(first && next_c == 0) && k != total - 1;
    if (!(last && c == v - 1)) out.push_back({Op::SendForward, mb_id(k), c});
    if (recv) recv_prev(next_c);
    if (k == warmup - 1 && !all_warmup && !last) recv_next(v - 1);
  }
  for (int k = 0; k < remaining; ++k) {
    const int fk = warmup + k, fc = chunk_id(fk, true), bc = chunk_id(k, false);
    out.push_back({Op::Forward, mb_id(fk), fc});
    out.push_back({Op::Backward, mb_id(k), bc});
    int next_fc, next_bc;
    bool recv_f = true, recv_b = true;
    if (first) {
      next_fc = chunk_id(fk - (pp - 1), true);
      recv_f = next_fc != v - 1;
      next_fc += 1;
    } else {
      next_fc = chunk_id(fk + 1, true);
    }
    if (last) {
      next_bc = chunk_id(k - (pp - 1), false);
      recv_b = next_bc != 0;
      next_bc -= 1;
    } else {
      next_bc = chunk_id(k + 1, false);
    }
    if (k == remaining - 1) recv_f = false;
    if (!(last && fc == v - 1)) out.push_back({Op::SendForward, mb_id(fk), fc});
    if (!(first && bc == 0)) out.push_back({Op::SendBackward, mb_id(k), bc});
    if (recv_f) recv_prev(next_fc);
    if (recv_b) recv_next(next_bc);
  }
  if (all_warmup && !last) recv_next(v - 1);
  for (int k = remaining; k < total; ++k) {
    const int c = chunk_id(k, false);
    out.push_back({Op::Backward, mb_id(k), c});
    if (!(first && c == 0)) out.push_back({Op::SendBackward, mb_id(k), c});
    const int next_c = chunk_id(k + 1, false);
    if (!(last && next_c == v - 1) && k != total - 1) recv_next(next_c);
  }
  return out;
}

TEST(Schedule, InterleavedRejectsBadArguments) {
  auto message = [](ScheduleKind kind, int stage, int pp, int m, int v) {
    try {
      make_schedule(kind, stage, pp, m, v);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(ScheduleKind::OneFOneB, 0, 2, 4, 0).find("virtual_stages >= 1"),
            std::string::npos);
  const std::string gpipe = message(ScheduleKind::GPipe, 0, 2, 4, 2);
  EXPECT_NE(gpipe.find("not GPipe"), std::string::npos) << gpipe;
  const std::string one_stage = message(ScheduleKind::OneFOneB, 0, 1, 4, 2);
  EXPECT_NE(one_stage.find("needs pp >= 2"), std::string::npos) << one_stage;
  // m must be a multiple of pp; the message names both.
  for (int m : {1, 3, 5, 6, 7, 9}) {
    const std::string text = message(ScheduleKind::OneFOneB, 1, 4, m, 2);
    std::string expected = "multiple of pp = 4, got ";
    expected += std::to_string(m);
    EXPECT_NE(text.find(expected), std::string::npos)
        << text;
  }
  EXPECT_EQ(message(ScheduleKind::OneFOneB, 3, 4, 8, 2), "no error");
  // v = 1 is the plain schedule, whatever m.
  for (ScheduleKind kind : kKinds)
    EXPECT_EQ(to_string(make_schedule(kind, 1, 4, 5, 1), true),
              to_string(make_schedule(kind, 1, 4, 5), true));
}

TEST(Schedule, TransferPeer) {
  // pp = 4: stage 1 chunk 1's neighbours are stages 0 and 2 on chunk 1; the ring closes between
  // stage 3 chunk c and stage 0 chunk c+1.
  auto peer = [](Op op, int stage, int chunk) {
    const Peer p = transfer_peer(op, stage, chunk, 4);
    return std::to_string(p.stage) + "." + std::to_string(p.chunk);
  };
  EXPECT_EQ(peer(Op::RecvForward, 1, 1), "0.1");
  EXPECT_EQ(peer(Op::SendBackward, 1, 1), "0.1");
  EXPECT_EQ(peer(Op::SendForward, 1, 1), "2.1");
  EXPECT_EQ(peer(Op::RecvBackward, 1, 1), "2.1");
  EXPECT_EQ(peer(Op::SendForward, 3, 0), "0.1");
  EXPECT_EQ(peer(Op::RecvBackward, 3, 0), "0.1");
  EXPECT_EQ(peer(Op::RecvForward, 0, 1), "3.0");
  EXPECT_EQ(peer(Op::SendBackward, 0, 1), "3.0");
  // No peer: the chunk falls outside [0, v).
  EXPECT_EQ(peer(Op::RecvForward, 0, 0), "3.-1");
  EXPECT_EQ(peer(Op::SendForward, 3, 1), "0.2");  // the last virtual stage when v = 2
}

// pp = 2, v = 2, m = 2, written out by hand from Megatron's rounds. Stage 0 runs all forwards
// first (its warmup 2 + 2 covers all 4 virtual micro-batches); stage 1 warms up with 2.
TEST(Schedule, InterleavedExactText) {
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 0, 2, 2, 2), true),
            "F0 SF0 F1 SF1 RF0.1 F0.1 SF0.1 RF1.1 F1.1 SF1.1 RB0.1 B0.1 SB0.1 RB1.1 B1.1 SB1.1 "
            "RB0 B0 RB1 B1");
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::OneFOneB, 1, 2, 2, 2), true),
            "RF0 F0 SF0 RF1 F1 SF1 RF0.1 F0.1 B0.1 SB0.1 RF1.1 F1.1 B1.1 SB1.1 RB0 B0 SB0 RB1 B1 "
            "SB1");
  // A steady round: forward, backward, then one run with both sends and both receives.
  const auto groups = transfer_groups(make_schedule(ScheduleKind::OneFOneB, 1, 2, 4, 2));
  std::string text;
  for (const auto& g : groups) {
    text += '[';
    text += to_string(g, true);
    text += ']';
  }
  EXPECT_NE(text.find("[F2][B0][SF2 SB0 RF3 RB1][F3]"), std::string::npos) << text;
  // Stage 1's chunk 1 is the last virtual stage: its rounds send no activations.
  EXPECT_NE(text.find("[F1.1][B1.1][SB1.1 RF2 RB0][F2]"), std::string::npos) << text;
}

TEST(Schedule, InterleavedIsMegatronOrder) {
  for (const Layout& l : interleaved_layouts())
    for (int s = 0; s < l.pp; ++s) {
      SCOPED_TRACE(name(l) + " stage=" + std::to_string(s));
      const std::vector<Action> a = make_schedule(ScheduleKind::OneFOneB, s, l.pp, l.m, l.v);
      ASSERT_EQ(to_string(a, true), to_string(megatron_interleaved(s, l.pp, l.m, l.v), true));
      // Phases read back off the list: leading forwards = warmup (+ the first steady forward).
      const int total = l.m * l.v;
      const int warmup = std::min(2 * (l.pp - s - 1) + (l.v - 1) * l.pp, total);
      const std::vector<Action> ops = compute_ops(a);
      int leading_f = 0;
      while (leading_f < int(ops.size()) && ops[size_t(leading_f)].op == Op::Forward) ++leading_f;
      EXPECT_EQ(leading_f, std::min(warmup + 1, total));
      // Forwards in groups of pp micro-batches, each group through chunk 0..v-1; backwards the
      // same with the chunks reversed; within a chunk, micro-batches in order.
      std::vector<Action> forwards, backwards;
      for (const Action& op : ops) (op.op == Op::Forward ? forwards : backwards).push_back(op);
      ASSERT_EQ(int(forwards.size()), total);
      ASSERT_EQ(int(backwards.size()), total);
      int k = 0;
      for (int group = 0; group < l.m / l.pp; ++group)
        for (int c = 0; c < l.v; ++c)
          for (int i = 0; i < l.pp; ++i, ++k) {
            EXPECT_TRUE(same(forwards[size_t(k)], Op::Forward, group * l.pp + i) &&
                        forwards[size_t(k)].chunk == c)
                << k;
            EXPECT_TRUE(same(backwards[size_t(k)], Op::Backward, group * l.pp + i) &&
                        backwards[size_t(k)].chunk == l.v - 1 - c)
                << k;
          }
      // Transfers only where a peer exists, one per compute op that needs it.
      int recv_f = 0, send_f = 0, recv_b = 0, send_b = 0;
      for (const Action& op : a) {
        recv_f += op.op == Op::RecvForward;
        send_f += op.op == Op::SendForward;
        recv_b += op.op == Op::RecvBackward;
        send_b += op.op == Op::SendBackward;
      }
      const int with_prev = total - (s == 0 ? l.m : 0), with_next = total - (s == l.pp - 1 ? l.m : 0);
      EXPECT_EQ(recv_f, with_prev);
      EXPECT_EQ(send_b, with_prev);
      EXPECT_EQ(send_f, with_next);
      EXPECT_EQ(recv_b, with_next);
    }
}

TEST(Schedule, InterleavedCompletesUnderBothSimulators) {
  int layouts = 0;
  for (const Layout& l : interleaved_layouts()) {
    const auto stages = interleaved_stages(l);
    EXPECT_EQ(simulate(stages, l.m, l.v), "") << name(l);
    EXPECT_EQ(simulate_grouped(stages, l.m, l.v), "") << name(l);
    ++layouts;
  }
  EXPECT_EQ(layouts, 3 * (8 + 5 + 4 + 3 + 2 + 2 + 2));  // v 2..4 x (m = pp, 2pp, ... <= 16)
}

// Each micro-batch goes through virtual stage 0, 1, ..., pp*v-1 (stage s chunk c is c*pp + s),
// each exactly once, and back: in the timed run every forward starts after the previous virtual
// stage's forward of that micro-batch has finished, and every backward after the next one's.
TEST(Schedule, InterleavedVisitsVirtualStagesInOrder) {
  for (const Layout& l : interleaved_layouts()) {
    SCOPED_TRACE(name(l));
    const auto stages = interleaved_stages(l);
    const StepTiming t = simulate_timing(stages, l.m, l.v);
    ASSERT_EQ(t.error, "");
    const int K = l.pp * l.v;
    // When (mb, virtual stage k) starts its forward / backward; -1 until seen.
    std::vector<long> f_start(size_t(l.m) * K, -1), b_start(size_t(l.m) * K, -1);
    for (int s = 0; s < l.pp; ++s)
      for (size_t i = 0; i < stages[size_t(s)].size(); ++i) {
        const Action& a = stages[size_t(s)][i];
        if (a.op != Op::Forward && a.op != Op::Backward) continue;
        long& slot = (a.op == Op::Forward ? f_start : b_start)[size_t(a.mb) * K + a.chunk * l.pp + s];
        EXPECT_EQ(slot, -1) << "twice: " << to_string({a}) << " on stage " << s;
        slot = t.start[size_t(s)][i];
      }
    for (int mb = 0; mb < l.m; ++mb) {
      const size_t row = size_t(mb) * K;
      for (int k = 0; k < K; ++k) {
        ASSERT_GE(f_start[row + k], 0) << "mb " << mb << " never forwarded on virtual stage " << k;
        ASSERT_GE(b_start[row + k], 0) << "mb " << mb << " never backwarded on virtual stage " << k;
        if (k > 0) {
          EXPECT_GE(f_start[row + k], f_start[row + k - 1] + 1) << mb << " " << k;
        }
        if (k < K - 1) {
          EXPECT_GE(b_start[row + k], b_start[row + k + 1] + 2) << mb << " " << k;
        }
      }
      EXPECT_GE(b_start[row + K - 1], f_start[row + K - 1] + 1) << mb;
    }
  }
}

// Why the interleaved lists are not built like v = 1's (receive right before each compute, send
// right after, warmup pp - s - 1 + (v - 1) * pp): MPI's buffered sends run them, but the last
// stage feeds stage 0, so under NCCL's rendezvous the alternating runs wait on each other around
// the ring (pp >= 3), or, with pp = 2, an activation meets a gradient in NCCL's order.
TEST(Schedule, InterleavedNeedsMegatronRounds) {
  auto naive = [](int s, int pp, int m, int v) {
    std::vector<Action> out;
    auto forward = [&](int mb, int c) {
      if (s > 0 || c > 0) out.push_back({Op::RecvForward, mb, c});
      out.push_back({Op::Forward, mb, c});
      if (s < pp - 1 || c < v - 1) out.push_back({Op::SendForward, mb, c});
    };
    auto backward = [&](int mb, int c) {
      if (s < pp - 1 || c < v - 1) out.push_back({Op::RecvBackward, mb, c});
      out.push_back({Op::Backward, mb, c});
      if (s > 0 || c > 0) out.push_back({Op::SendBackward, mb, c});
    };
    auto nth = [&](int k, bool fwd) {  // virtual micro-batch k: (mb, chunk)
      const int in_group = k % (pp * v), c = in_group / pp;
      return std::pair<int, int>{k / (pp * v) * pp + in_group % pp, fwd ? c : v - 1 - c};
    };
    const int total = m * v, warmup = std::min(pp - s - 1 + (v - 1) * pp, total);
    for (int k = 0; k < warmup; ++k) forward(nth(k, true).first, nth(k, true).second);
    for (int i = 0; i < total - warmup; ++i) {
      forward(nth(warmup + i, true).first, nth(warmup + i, true).second);
      backward(nth(i, false).first, nth(i, false).second);
    }
    for (int k = total - warmup; k < total; ++k) backward(nth(k, false).first, nth(k, false).second);
    return out;
  };
  for (const Layout& l : interleaved_layouts()) {
    SCOPED_TRACE(name(l));
    std::vector<std::vector<Action>> stages;
    for (int s = 0; s < l.pp; ++s) stages.push_back(naive(s, l.pp, l.m, l.v));
    EXPECT_EQ(simulate(stages, l.m, l.v), "");
    const std::string grouped = simulate_grouped(stages, l.m, l.v);
    if (l.m == l.pp) {  // no steady state: nothing alternates
      EXPECT_EQ(grouped, "");
    } else if (l.pp == 2) {
      EXPECT_NE(grouped.find(" meets "), std::string::npos) << grouped;
    } else {
      EXPECT_EQ(grouped.rfind("deadlock:", 0), 0u) << grouped;
    }
  }
}

// Why m must be a multiple of pp: Megatron's rounds with a short last group break.
TEST(Schedule, InterleavedNeedsWholeGroups) {
  auto stages = [](int pp, int m, int v) {
    std::vector<std::vector<Action>> out;
    for (int s = 0; s < pp; ++s) out.push_back(megatron_interleaved(s, pp, m, v));
    return out;
  };
  // pp = 3, m = 4: stuck even with buffered sends.
  const std::string three = simulate(stages(3, 4, 2), 4, 2);
  EXPECT_EQ(three.rfind("deadlock:", 0), 0u) << three;
  // pp = 2, m = 3: stage 0 reaches the short group's chunk-1 forward before the rounds have
  // brought its input.
  const std::string two = simulate(stages(2, 3, 2), 3, 2);
  EXPECT_NE(two.find("(F2.1): Forward before its RecvForward"), std::string::npos) << two;
  // With whole groups the transcription is what make_schedule builds, and it runs.
  EXPECT_EQ(simulate_grouped(stages(3, 6, 2), 6, 2), "");
}

TEST(Schedule, MaxInFlightPerChunk) {
  // pp = 2, v = 2, m = 2 (lists in InterleavedExactText): stage 0 holds both micro-batches of
  // both chunks at once; stage 1 both of chunk 0 but one of chunk 1 (its F, B alternate).
  const auto s0 = make_schedule(ScheduleKind::OneFOneB, 0, 2, 2, 2);
  const auto s1 = make_schedule(ScheduleKind::OneFOneB, 1, 2, 2, 2);
  EXPECT_EQ(max_in_flight(s0), 4);
  EXPECT_EQ(max_in_flight(s0, 0), 2);
  EXPECT_EQ(max_in_flight(s0, 1), 2);
  EXPECT_EQ(max_in_flight(s1), 3);
  EXPECT_EQ(max_in_flight(s1, 0), 2);
  EXPECT_EQ(max_in_flight(s1, 1), 1);
  EXPECT_EQ(max_in_flight(s1, 2), 0);
  for (const Layout& l : interleaved_layouts())
    for (int s = 0; s < l.pp; ++s) {
      SCOPED_TRACE(name(l) + " stage=" + std::to_string(s));
      const std::vector<Action> a = make_schedule(ScheduleKind::OneFOneB, s, l.pp, l.m, l.v);
      const int warmup = std::min(2 * (l.pp - s - 1) + (l.v - 1) * l.pp, l.m * l.v);
      EXPECT_EQ(max_in_flight(a), std::min(warmup + 1, l.m * l.v));
      // The executor's slots: mb % max_in_flight(a, c) is never taken by another live
      // micro-batch of chunk c when (mb, c) is forwarded.
      std::vector<int> slots(size_t(l.v)), sum_check(size_t(l.v), 0);
      int sum = 0;
      for (int c = 0; c < l.v; ++c) sum += slots[size_t(c)] = max_in_flight(a, c);
      EXPECT_GE(sum, max_in_flight(a));
      std::vector<std::vector<int>> holder(size_t(l.v));
      for (int c = 0; c < l.v; ++c) {
        ASSERT_GE(slots[size_t(c)], 1);
        holder[size_t(c)].assign(size_t(slots[size_t(c)]), -1);
      }
      for (const Action& op : a) {
        if (op.op != Op::Forward && op.op != Op::Backward) continue;
        int& h = holder[size_t(op.chunk)][size_t(op.mb % slots[size_t(op.chunk)])];
        if (op.op == Op::Forward) {
          EXPECT_EQ(h, -1) << to_string({op}) << " finds its slot held by micro-batch " << h;
          h = op.mb;
        } else {
          EXPECT_EQ(h, op.mb) << to_string({op});
          h = -1;
        }
      }
    }
  // v = 1: chunk 0 is everything.
  for (ScheduleKind kind : kKinds) {
    const auto a = make_schedule(kind, 1, 4, 8);
    EXPECT_EQ(max_in_flight(a, 0), max_in_flight(a));
  }
}

TEST(Schedule, SimulateChecksChunks) {
  const Layout l{2, 2, 2};
  // A receive before the first virtual stage.
  auto stages = interleaved_stages(l);
  stages[0].insert(stages[0].begin(), Action{Op::RecvForward, 0, 0});
  EXPECT_NE(simulate(stages, 2, 2).find(
                "stage 0 chunk 0 (the first virtual stage) has no previous stage to receive from"),
            std::string::npos)
      << simulate(stages, 2, 2);
  // A send after the last virtual stage.
  stages = interleaved_stages(l);
  stages[1].push_back({Op::SendForward, 1, 1});
  EXPECT_NE(simulate(stages, 2, 2).find("(the last virtual stage) has no next stage to send to"),
            std::string::npos)
      << simulate(stages, 2, 2);
  // Stage 1 receives chunk 1's inputs (from stage 0 chunk 1) in the wrong order.
  stages = interleaved_stages(l);
  std::vector<Action*> chunk1_receives;
  for (Action& a : stages[1])
    if (a.op == Op::RecvForward && a.chunk == 1) chunk1_receives.push_back(&a);
  ASSERT_EQ(chunk1_receives.size(), 2u);
  std::swap(chunk1_receives[0]->mb, chunk1_receives[1]->mb);
  EXPECT_NE(simulate(stages, 2, 2).find("expects the activations of micro-batch 1 chunk 1 but "
                                        "stage 0 sent micro-batch 0 chunk 1 first"),
            std::string::npos)
      << simulate(stages, 2, 2);
  // Stage 1 expects its chunk-0 input from stage 0's chunk 1 (it comes from chunk 0).
  stages = interleaved_stages(l);
  ASSERT_TRUE(same(stages[1][0], Op::RecvForward, 0));
  stages[1][0].chunk = 1;
  EXPECT_NE(simulate(stages, 2, 2).find("(RF0.1)"), std::string::npos) << simulate(stages, 2, 2);
  // The last stage's chunk 0 feeds stage 0's chunk 1 across the ring: drop that send.
  stages = interleaved_stages(l);
  std::vector<Action> kept;
  for (const Action& a : stages[1])
    if (!(a.op == Op::SendForward && a.chunk == 0)) kept.push_back(a);
  stages[1] = kept;
  EXPECT_NE(simulate(stages, 2, 2).find("waits for stage 1"), std::string::npos)
      << simulate(stages, 2, 2);
  // Work missing, chunk out of range, bad argument.
  EXPECT_EQ(simulate(interleaved_stages(l), 4, 2), "stage 0 never forwards micro-batch 2 chunk 0");
  EXPECT_NE(simulate({{{Op::Forward, 0, 2}}}, 1, 2).find("chunk outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(simulate(interleaved_stages(l), 2, 0), "");
  // Lists of two chunks read as one: stage 1's chunk-1 work is out of range.
  EXPECT_NE(simulate(interleaved_stages(l), 2, 1).find("chunk outside [0, 1)"), std::string::npos);
}

// NCCL has no tags: with pp = 2 the activations and the gradients between the two ranks share
// one ordered channel, so a run that receives the gradient before the activation crosses them.
// MPI keeps the kinds apart, so `simulate` accepts the same lists.
TEST(Schedule, GroupedChecksOrderBetweenTwoStages) {
  auto stages = interleaved_stages({2, 2, 4});
  ASSERT_EQ(simulate_grouped(stages, 4, 2), "");
  bool swapped = false;
  for (size_t i = 0; i + 1 < stages[1].size() && !swapped; ++i)
    if (stages[1][i].op == Op::RecvForward && stages[1][i + 1].op == Op::RecvBackward) {
      std::swap(stages[1][i], stages[1][i + 1]);
      swapped = true;
    }
  ASSERT_TRUE(swapped);
  EXPECT_EQ(simulate(stages, 4, 2), "");
  const std::string e = simulate_grouped(stages, 4, 2);
  EXPECT_NE(e.find(" meets "), std::string::npos) << e;
}

// ---- Timing: the bubble ----

TEST(Schedule, TimingHandChecked) {
  // 1F1B, pp = 2, m = 1: stage 0 F [0,1], stage 1 F [1,2] B [2,4], stage 0 B [4,6].
  const StepTiming t = simulate_timing(all_stages(ScheduleKind::OneFOneB, 2, 1), 1);
  ASSERT_EQ(t.error, "");
  EXPECT_EQ(t.length, 6);
  EXPECT_EQ(t.busy, (std::vector<long>{3, 3}));
  EXPECT_DOUBLE_EQ(t.idle_fraction(0), 0.5);
  EXPECT_EQ(to_string(all_stages(ScheduleKind::OneFOneB, 2, 1)[0], true), "F0 SF0 RB0 B0");
  EXPECT_EQ(t.start[0], (std::vector<long>{0, 1, 4, 4}));  // RB0 arrives when stage 1's B ends
  // Interleaved pp = 2, v = 2, m = 2 (InterleavedExactText), worked by hand: stage 0's compute
  // F0 F1 F0.1 F1.1 at 0..3; stage 1's F0.1 at 3 and B0.1 at 4..6, so stage 0's B0.1 at 6;
  // B1.1 waits for stage 1's B1.1 (7..9): 9; B0 for stage 1's B0 (9..11): 11; B1: 13, ending 15.
  const Layout l{2, 2, 2};
  const StepTiming u = simulate_timing(interleaved_stages(l), 2, 2);
  ASSERT_EQ(u.error, "");
  std::string starts;
  const auto s0 = make_schedule(ScheduleKind::OneFOneB, 0, 2, 2, 2);
  for (size_t i = 0; i < s0.size(); ++i)
    if (s0[i].op == Op::Forward || s0[i].op == Op::Backward)
      starts += to_string({s0[i]}) + "@" + std::to_string(u.start[0][i]) + " ";
  EXPECT_EQ(starts, "F0@0 F1@1 F0.1@2 F1.1@3 B0.1@6 B1.1@9 B0@11 B1@13 ");
  EXPECT_EQ(u.length, 15);
  EXPECT_EQ(u.busy, (std::vector<long>{12, 12}));
  EXPECT_DOUBLE_EQ(u.idle_fraction(1), 0.2);  // (pp-1)/(v*m+pp-1) = 1/5
  // Errors come back instead of times.
  EXPECT_NE(simulate_timing({{{Op::RecvForward, 0}}}, 1).error, "");
  EXPECT_NE(simulate_timing(interleaved_stages(l), 2, 2, -1, 2).error, "");
}

// The idle share of every stage is exactly (pp-1)/(m+pp-1) for GPipe and 1F1B and
// (pp-1)/(v*m+pp-1) for interleaved 1F1B, for Forward:Backward costs 1:2 (the usual ratio) and
// others: the step lasts (v*m + pp - 1) * (f + b) and every stage works v*m*(f + b) of it.
// Compared in integers (busy * (v*m+pp-1) == v*m * length), so "exactly" means exactly.
TEST(Schedule, BubbleMatchesTheFormula) {
  const std::pair<int, int> costs[] = {{1, 2}, {1, 1}, {2, 3}, {1, 3}};
  for (const auto& [f, b] : costs) {
    for (ScheduleKind kind : kKinds)
      for (int pp = 1; pp <= 8; ++pp)
        for (int m = 1; m <= 16; ++m) {
          const StepTiming t = simulate_timing(all_stages(kind, pp, m), m, 1, f, b);
          ASSERT_EQ(t.error, "");
          EXPECT_EQ(t.length, long(m + pp - 1) * (f + b)) << pp << " " << m;
          for (int s = 0; s < pp; ++s) {
            EXPECT_EQ(t.busy[size_t(s)] * (m + pp - 1), long(m) * t.length) << pp << " " << m;
            EXPECT_NEAR(t.idle_fraction(s), double(pp - 1) / (m + pp - 1), 1e-12);
          }
        }
    for (const Layout& l : interleaved_layouts()) {
      const StepTiming t = simulate_timing(interleaved_stages(l), l.m, l.v, f, b);
      ASSERT_EQ(t.error, "");
      const int vm = l.v * l.m;
      EXPECT_EQ(t.length, long(vm + l.pp - 1) * (f + b)) << name(l);
      for (int s = 0; s < l.pp; ++s) {
        EXPECT_EQ(t.busy[size_t(s)] * (vm + l.pp - 1), long(vm) * t.length) << name(l);
        EXPECT_NEAR(t.idle_fraction(s), double(l.pp - 1) / (vm + l.pp - 1), 1e-12);
      }
    }
  }
  // The point of interleaving, in numbers: pp = 4, m = 8 idles 3/11 of the step with 1F1B and
  // 3/19, 3/27, 3/35 with 2, 3, 4 chunks per stage.
  EXPECT_NEAR(simulate_timing(all_stages(ScheduleKind::OneFOneB, 4, 8), 8).idle_fraction(0),
              3.0 / 11, 1e-12);
  for (int v = 2; v <= 4; ++v)
    EXPECT_NEAR(simulate_timing(interleaved_stages({4, v, 8}), 8, v).idle_fraction(0),
                3.0 / (8 * v + 3), 1e-12);
}

TEST(Schedule, SendPoolBoundedByTwoPerChunk) {
  // The executor's backward send buffers (send_pool_size): two per chunk used in turn, fewer
  // where the chunk keeps fewer slots, never one per micro-batch in flight. pp = 8, m = 32:
  // stage 1 keeps 7 micro-batches of 1F1B in flight but 2 send buffers; the last stage 1 and 1.
  const auto s1 = make_schedule(ScheduleKind::OneFOneB, 1, 8, 32, 1);
  EXPECT_EQ(schedule_slots(s1), 7);
  EXPECT_EQ(send_pool_size(s1), 2);
  const auto last = make_schedule(ScheduleKind::OneFOneB, 7, 8, 32, 1);
  EXPECT_EQ(schedule_slots(last), 1);
  EXPECT_EQ(send_pool_size(last), 1);
  // GPipe keeps all 32, still 2 buffers; interleaved (v = 2): 2 per chunk.
  EXPECT_EQ(send_pool_size(make_schedule(ScheduleKind::GPipe, 3, 8, 32, 1)), 2);
  const auto v2 = make_schedule(ScheduleKind::OneFOneB, 2, 8, 32, 2);
  for (int c = 0; c < 2; ++c) {
    EXPECT_GT(schedule_slots(v2, c), 2);
    EXPECT_EQ(send_pool_size(v2, c), 2);
  }
  // No transfer group sends two gradients of one chunk, so two buffers always suffice.
  for (const auto& group : transfer_groups(v2)) {
    int sends[2] = {0, 0};
    for (const Action& a : group)
      if (a.op == Op::SendBackward) ++sends[a.chunk];
    EXPECT_LE(sends[0], 1);
    EXPECT_LE(sends[1], 1);
  }
}

}  // namespace
}  // namespace tessera
