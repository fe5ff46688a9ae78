#include "engine/sequences.hpp"

#include <algorithm>
#include <cstddef>

namespace tessera {

void context_chunks(const int32_t* full, int B, int T, int cp, int r, int32_t* out) {
  const size_t Tl = size_t(T) / size_t(cp), Tc = Tl / 2;
  const size_t chunks[2] = {size_t(r), size_t(2 * cp - 1 - r)};
  for (size_t b = 0; b < size_t(B); ++b)
    for (size_t h = 0; h < 2; ++h)
      std::copy(full + b * T + chunks[h] * Tc, full + b * T + (chunks[h] + 1) * Tc,
                out + b * Tl + h * Tc);
}

void document_ids(const int32_t* inputs, int B, int T, int64_t eot, int32_t* start, int32_t* pos) {
  for (size_t b = 0; b < size_t(B); ++b) {
    int32_t at = 0;
    for (size_t t = 0; t < size_t(T); ++t) {
      if (t > 0 && inputs[b * T + t - 1] == eot) at = int32_t(t);
      start[b * T + t] = at;
      pos[b * T + t] = int32_t(t) - at;
    }
  }
}

}  // namespace tessera
