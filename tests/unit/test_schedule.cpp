// Pipeline schedules without MPI: every generated list for pp 1..8, m 1..12 and both kinds does
// each micro-batch's work once in a legal order, has the 1F1B phase lengths and activation
// footprint of Megatron's schedule, and runs to completion under `simulate`; hand-broken lists make
// `simulate` fail with a message naming the problem.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

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

TEST(Schedule, ParseSchedule) {
  EXPECT_EQ(parse_schedule("gpipe"), ScheduleKind::GPipe);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::OneFOneB);
  for (const char* bad : {"", "GPipe", "1F1B", "interleaved", "1f1b "}) {
    try {
      parse_schedule(bad);
      ADD_FAILURE() << "no error for \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("\"" + std::string(bad) + "\""), std::string::npos) << message;
      EXPECT_NE(message.find("gpipe"), std::string::npos) << message;
      EXPECT_NE(message.find("1f1b"), std::string::npos) << message;
    }
  }
}

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
  EXPECT_EQ(simulate_grouped(stages, 2, /*grouped=*/false),
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

}  // namespace
}  // namespace tessera
