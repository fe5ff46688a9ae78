#pragma once
// A unit of a full parameter buffer made whole again on every rank of its group, after each rank
// updated its part of it in place (ShardPlan, model/shard.hpp): ZeRO-2's update
// (optim/sharded_weights.hpp) and ZeRO-1's with expert parallelism (optim/distributed.hpp).
#include <cstddef>

#include "model/shard.hpp"

namespace tessera {

// This rank's part of unit u of `full` (laid out as `tile`) put at its place in `padded` (room
// for the unit's group x part elements; zero past the unit's end), all-gathered there over
// `group`, and the unit copied back into `full` (whose next unit the padding would overwrite).
// A group of one has nothing to gather: its part is the unit, in place.
template <class Backend, typename T>
void gather_unit(const LocalLayout& tile, const ShardPlan& plan, int u, T* full, T* padded,
                 typename Backend::Comm* group) {
  if (plan.group[size_t(u)] == 1) return;
  const Unit& unit = tile.units[size_t(u)];
  const size_t part = plan.part[size_t(u)];
  const auto [lo, hi] = plan.range(tile, u);
  T* mine = padded + size_t(plan.member[size_t(u)]) * part;
  Backend::zero(mine, part * sizeof(T));
  if (hi > lo) Backend::copy(mine, full + lo, (hi - lo) * sizeof(T));
  group->all_gather(static_cast<const T*>(mine), padded, part);
  Backend::copy(full + unit.begin, padded, unit.size() * sizeof(T));
}

}  // namespace tessera
