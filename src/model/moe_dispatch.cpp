#include "model/moe_dispatch.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tessera {

int moe_capacity(double factor, int N, int k, int E) {
  if (factor <= 0) return N;
  return int(std::ceil(factor * double(N) * k / E));
}

MoeDispatch plan_dispatch(const int32_t* expert, int N, int k, int E, int capacity) {
  MoeDispatch d;
  d.counts.assign(size_t(E), 0);
  d.routed.assign(size_t(E), 0);
  d.slot_of.assign(size_t(N) * k, -1);
  // Which choices an expert keeps: its first `capacity` in token order (choice order within a
  // token, though a token chooses an expert once).
  std::vector<int32_t> place(size_t(N) * k, -1);
  for (size_t tj = 0; tj < size_t(N) * k; ++tj) {
    const int e = expert[tj];
    if (e < 0 || e >= E)
      throw std::logic_error("moe: a choice of expert " + std::to_string(e) + " of " +
                             std::to_string(E));
    if (d.routed[size_t(e)]++ < capacity) place[tj] = d.counts[size_t(e)]++;
    else ++d.dropped;
  }
  d.offsets.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) d.offsets[size_t(e) + 1] = d.offsets[size_t(e)] + d.counts[size_t(e)];
  d.token_of.assign(size_t(d.offsets[size_t(E)]), 0);
  for (size_t tj = 0; tj < size_t(N) * k; ++tj) {
    if (place[tj] < 0) continue;
    const int32_t row = d.offsets[size_t(expert[tj])] + place[tj];
    d.slot_of[tj] = row;
    d.token_of[size_t(row)] = int32_t(tj / size_t(k));
  }
  return d;
}

}  // namespace tessera
