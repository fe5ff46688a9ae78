// The planner's network tiers (plan/network.hpp) against collectives priced by hand, on a DGX
// A100-like node: 8 GPUs, NVLink 300 GB/s per GPU one way, 8 NICs of 25 GB/s (HDR 200 Gb/s),
// 5 us per inter-node step, 1 us per NVLink step; a 1 GB all-reduce unless said otherwise.
#include <gtest/gtest.h>

#include "plan/network.hpp"

using namespace tessera;

namespace {

Network dgx() {
  Network n;
  n.devices_per_node = 8;
  n.nics_per_node = 8;
  n.nic_bw = 25e9;
  n.intra_bw = 300e9;
  n.latency = 5e-6;
  n.intra_latency = 1e-6;
  return n;
}

}  // namespace

TEST(Network, PlacementFollowsTheRankOrder) {
  const Network net = dgx();
  const Placement inside = place(net, 8, 1);  // dp = 8 with tp = 1: one node
  EXPECT_EQ(inside.per_node, 8);
  EXPECT_EQ(inside.nodes, 1);
  const Placement spread = place(net, 4, 8);  // dp = 4 with tp = 8: one per node
  EXPECT_EQ(spread.per_node, 1);
  EXPECT_EQ(spread.nodes, 4);
  EXPECT_EQ(spread.groups_per_node, 8);
  const Placement pairs = place(net, 8, 4);  // dp = 8 with tp = 4: 2 per node on 4 nodes
  EXPECT_EQ(pairs.per_node, 2);
  EXPECT_EQ(pairs.nodes, 4);
  EXPECT_EQ(pairs.groups_per_node, 4);
}

TEST(Network, DataParallelGroupInsideOneNode) {
  // Ring over NVLink: 2 * 7/8 * 1 GB / 300 GB/s + 14 steps of 1 us.
  const CollectiveTime t = all_reduce(dgx(), place(dgx(), 8, 1), 1e9);
  EXPECT_EQ(t.algorithm, Algorithm::Ring);
  EXPECT_NEAR(t.seconds, 2 * 7.0 / 8 * 1e9 / 300e9 + 14 * 1e-6, 1e-9);
}

TEST(Network, DataParallelGroupOnePerNode) {
  // 4 nodes, one member each: the 8 groups of the node share its 8 NICs, 25 GB/s each:
  // ring 2 * 3/4 * 1 GB / 25 GB/s + 6 steps of 5 us = 60.03 ms (the tree: 80 ms + ...).
  const CollectiveTime t = all_reduce(dgx(), place(dgx(), 4, 8), 1e9);
  EXPECT_EQ(t.algorithm, Algorithm::Ring);
  EXPECT_NEAR(t.seconds, 0.060030, 1e-9);
}

TEST(Network, DataParallelGroupTwoPerNodeOverFourNodes) {
  // 4 groups share a node's 200 GB/s: 50 GB/s each, one crossing per node in the ring:
  // 2 * 7/8 * 1 GB / 50 GB/s = 35 ms (NVLink's 5.8 ms hides under it) + 14 steps of 5 us.
  const CollectiveTime t = all_reduce(dgx(), place(dgx(), 8, 4), 1e9);
  EXPECT_EQ(t.algorithm, Algorithm::Ring);
  EXPECT_NEAR(t.seconds, 0.035 + 14 * 5e-6, 1e-9);
}

TEST(Network, WholeNodesShareEveryNic) {
  // The case: 1.7B parameters' fp32 gradients (6.8 GB) over 32 GPUs with tp = 1:
  // 8 per node, the node's 200 GB/s for one group: 2 * 31/32 * 6.8 GB / 200 GB/s = 65.9 ms
  // (charging every GPU's share at one NIC gave 8x that).
  const CollectiveTime t = all_reduce(dgx(), place(dgx(), 32, 1), 6.8e9);
  EXPECT_NEAR(t.seconds, 2 * 31.0 / 32 * 6.8e9 / 200e9 + 62 * 5e-6, 1e-9);
}

TEST(Network, SmallMessagesTakeTheTree) {
  // 1 MB over 32 nodes, one per node: ring 2 * 31/32 * 1 MB / 25 GB/s + 62 * 5 us = 387.5 us;
  // tree 2 * 1 MB / 25 GB/s + 2 * log2(32) * 5 us = 130 us.
  const CollectiveTime t = all_reduce(dgx(), place(dgx(), 32, 8), 1e6);
  EXPECT_EQ(t.algorithm, Algorithm::Tree);
  EXPECT_NEAR(t.seconds, 130e-6, 1e-10);
}

TEST(Network, HalvesAndSends) {
  const Network net = dgx();
  // A reduce-scatter over 4 nodes, one per node: 3/4 * 1 GB / 25 GB/s + 3 * 5 us.
  EXPECT_NEAR(ring_half(net, place(net, 4, 8), 1e9), 0.030015, 1e-9);
  // A pipeline send inside a node and across (every GPU sending: one NIC's share each).
  EXPECT_NEAR(send(net, 4, 1e8), 1e8 / 300e9 + 1e-6, 1e-12);
  EXPECT_NEAR(send(net, 64, 1e8), 1e8 / 25e9 + 5e-6, 1e-12);
  // One rank: nothing to move.
  EXPECT_EQ(all_reduce(net, place(net, 1, 1), 1e9).seconds, 0);
}

TEST(Network, AllToAllInsideOneNode) {
  // ep = 8 with tp = 1: every member's 1 GB goes to the 7 others over NVLink at once.
  EXPECT_NEAR(all_to_all(dgx(), place(dgx(), 8, 1), 1e9, 4), 1e9 / 300e9 + 4 * 1e-6, 1e-12);
}

TEST(Network, AllToAllAcrossNodes) {
  // ep = 4 with tp = 8, one member a node: all of it through the group's share of the NICs,
  // the node's 8 groups sharing 200 GB/s: 1 GB / 25 GB/s + one inter-node step.
  EXPECT_NEAR(all_to_all(dgx(), place(dgx(), 4, 8), 1e9), 0.040 + 5e-6, 1e-12);
  // ep = 8 with tp = 4, two members a node on 4 nodes: 6 of each member's 7 shares leave the
  // node, both members' through the group's 50 GB/s (34.3 ms; the NVLink share's 0.5 ms hides).
  EXPECT_NEAR(all_to_all(dgx(), place(dgx(), 8, 4), 1e9), 2 * 6.0 / 7 * 1e9 / 50e9 + 5e-6, 1e-12);
  EXPECT_EQ(all_to_all(dgx(), place(dgx(), 1, 1), 1e9), 0);
}
