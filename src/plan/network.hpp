#pragma once
// The network `tessera plan` prices collectives on: two tiers, inside a node (NVLink/NVSwitch,
// a bandwidth per device) and between nodes (NICs per node, a bandwidth per NIC), and a
// collective over a group priced by where its members sit. Ranks are numbered tp fastest, then
// cp, dp, pp: a group whose members are `stride` ranks apart has min(n, node / stride) of them
// per node (one per node once stride reaches a node), and the node's other devices run their
// own groups of the same kind at the same time, sharing its NICs. All-reduces take NCCL's ring
// or tree, whichever is faster (as NCCL's tuner does); reduce-scatters, all-gathers and sends
// the ring; all-to-alls (expert parallelism) send each member its share directly.
namespace tessera {

struct Network {
  int devices_per_node = 1;
  int nics_per_node = 1;
  double nic_bw = 0;          // bytes/s per NIC, one direction
  double intra_bw = 0;        // bytes/s per device, one direction, inside a node
  double latency = 5e-6;      // seconds per step of a collective that crosses nodes
  double intra_latency = 1e-6;  // seconds per step inside a node
};

// Where a group of n ranks, `stride` apart, sits.
struct Placement {
  int n = 1;         // members
  int per_node = 1;  // members on each node it touches
  int nodes = 1;     // nodes it spans
  int groups_per_node = 1;  // groups of its kind sharing each node (and its NICs)
};
Placement place(const Network& net, int n, int stride);

enum class Algorithm { Ring, Tree };
struct CollectiveTime {
  double seconds = 0;
  Algorithm algorithm = Algorithm::Ring;
};

// `ops` all-reduces of `bytes` payload in all over the group (each op its own latency).
CollectiveTime all_reduce(const Network& net, const Placement& g, double bytes, double ops = 1);
// A reduce-scatter or an all-gather of `bytes` (the whole buffer's payload), ring.
double ring_half(const Network& net, const Placement& g, double bytes, double ops = 1);
// An all-to-all in which each member sends `bytes` in all, an equal share to each other member
// (those on its node over the node's links, the rest through its NICs), in `ops` exchanges.
double all_to_all(const Network& net, const Placement& g, double bytes, double ops = 1);
// A point-to-point send of `bytes` between ranks `stride` apart, every device of a node sending
// at once (a pipeline's stages).
double send(const Network& net, int stride, double bytes, double ops = 1);

}  // namespace tessera
