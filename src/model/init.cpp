#include "model/init.hpp"

#include <cmath>

#include "common/rng.hpp"

namespace tessera {

float init_value(const ParamTensor& t, const ModelShape& shape, uint64_t seed, double std,
                 size_t index) {
  switch (t.init) {
    case Init::Zeros: return 0.0f;
    case Init::Ones: return 1.0f;
    case Init::Normal:
    case Init::ResidualNormal: {
      // Padded vocabulary rows never reach a logit; zero keeps them inert under weight decay.
      if (t.vocab_rows && index / size_t(shape.n_embd) >= size_t(shape.vocab_size)) return 0.0f;
      // GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 L).
      const double scale =
          t.init == Init::ResidualNormal ? std / std::sqrt(2.0 * shape.n_layer) : std;
      return static_cast<float>(scale * counter_normal(stream_key(seed, t.name), index));
    }
  }
  return 0.0f;
}

}  // namespace tessera
