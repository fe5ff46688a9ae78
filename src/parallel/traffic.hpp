#pragma once
// What a step sends, by group, in one numbering: the engine's counters (TrainEngine::payload),
// the planner's table (plan/comm.hpp) and the per-rank lines of metrics.jsonl
// (<name>_bytes_per_step) all index it by the same names:
//   tp     the tensor-parallel group {tp}
//   dp     the gradients' groups: dp x cp {dp, cp}, and ZeRO's shard and replica views of it
//   pp     the pipeline's sends {pp}
//   embed  the tied embedding's pair of pipeline ends (Mesh::embed)
//   cp     context parallelism's K/V blocks {cp}
//   ep     expert parallelism's all-to-all of the routed rows {ep} (the experts' gradient sum over
//          edp is the data-parallel reduction's: dp)
// A new axis adds its name here where its traffic is its own.
namespace tessera {

enum class Traffic { tp, dp, pp, embed, cp, ep };
inline constexpr int kTraffic = 6;
inline constexpr const char* kTrafficNames[kTraffic] = {"tp", "dp", "pp", "embed", "cp", "ep"};
inline const char* traffic_name(Traffic t) { return kTrafficNames[int(t)]; }

// Payload bytes by group.
struct TrafficBytes {
  double bytes[kTraffic] = {};
  double& operator[](Traffic t) { return bytes[int(t)]; }
  double operator[](Traffic t) const { return bytes[int(t)]; }
  TrafficBytes& operator+=(const TrafficBytes& o) {
    for (int k = 0; k < kTraffic; ++k) bytes[k] += o.bytes[k];
    return *this;
  }
  TrafficBytes operator-(const TrafficBytes& o) const {
    TrafficBytes out = *this;
    for (int k = 0; k < kTraffic; ++k) out.bytes[k] -= o.bytes[k];
    return out;
  }
};

}  // namespace tessera
