#include "plan/network.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

Placement place(const Network& net, int n, int stride) {
  Placement g;
  g.n = std::max(1, n);
  const int node = std::max(1, net.devices_per_node);
  stride = std::max(1, stride);
  g.per_node = stride >= node ? 1 : std::min(g.n, node / stride);
  g.nodes = (g.n + g.per_node - 1) / g.per_node;
  g.groups_per_node = std::max(1, node / g.per_node);
  return g;
}

namespace {

// The bandwidth one group has out of a node: its share of the node's NICs.
double node_share(const Network& net, const Placement& g) {
  return net.nics_per_node * net.nic_bw / g.groups_per_node;
}

// A ring of the n members: every member (and every node's one crossing per ring) moves
// `fraction` of the payload; the slower tier bounds the pipelined ring; `steps` steps each with
// its tier's latency.
double ring(const Network& net, const Placement& g, double bytes, double fraction, double steps) {
  if (g.n <= 1) return 0;
  double t = g.per_node > 1 ? fraction * bytes / net.intra_bw : 0;
  if (g.nodes > 1) t = std::max(t, fraction * bytes / node_share(net, g));
  return t + steps * (g.nodes > 1 ? net.latency : net.intra_latency);
}

}  // namespace

CollectiveTime all_reduce(const Network& net, const Placement& g, double bytes, double ops) {
  CollectiveTime out;
  if (g.n <= 1 || bytes <= 0) return out;
  const double n = g.n;
  out.seconds = ring(net, g, bytes, 2 * (n - 1) / n, ops * 2 * (n - 1));
  if (g.nodes > 1) {
    // NCCL's tree: a chain inside each node (reduce up, broadcast down: the payload twice over
    // NVLink), a double binary tree between nodes (each node sends and receives the payload
    // twice over: half of it up and down each tree).
    const double chain = g.per_node > 1 ? 2 * bytes / net.intra_bw : 0;
    const double tree = std::max(chain, 2 * bytes / node_share(net, g)) +
                        ops * (2 * std::ceil(std::log2(double(g.nodes))) * net.latency +
                               2 * (g.per_node - 1) * net.intra_latency);
    if (tree < out.seconds) out = {tree, Algorithm::Tree};
  }
  return out;
}

double ring_half(const Network& net, const Placement& g, double bytes, double ops) {
  const double n = g.n;
  return ring(net, g, bytes, (n - 1) / n, ops * (n - 1));
}

double all_to_all(const Network& net, const Placement& g, double bytes, double ops) {
  if (g.n <= 1 || bytes <= 0) return 0;
  // Every member sends at once: the shares for members on its node over NVLink, the rest of the
  // node's members' shares through the NICs this group has of the node (the same wire both ways).
  const double inside = bytes * (g.per_node - 1) / (g.n - 1.0), outside = bytes - inside;
  double t = inside / net.intra_bw;
  if (outside > 0) t = std::max(t, g.per_node * outside / node_share(net, g));
  return t + ops * (g.nodes > 1 ? net.latency : net.intra_latency);
}

double send(const Network& net, int stride, double bytes, double ops) {
  if (bytes <= 0) return 0;
  if (stride < net.devices_per_node) return bytes / net.intra_bw + ops * net.intra_latency;
  return bytes / (net.nics_per_node * net.nic_bw / net.devices_per_node) + ops * net.latency;
}

}  // namespace tessera
