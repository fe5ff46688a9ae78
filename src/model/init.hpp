#pragma once
// GPT-2 initialisation as a pure function of (seed, parameter name, canonical element index), so
// any rank can produce its shard of the same model without producing the rest.
#include <cstdint>

#include "model/param_layout.hpp"

namespace tessera {

// Value of canonical element `index` (row-major in the tensor's canonical shape).
float init_value(const ParamTensor& tensor, const ModelShape& shape, uint64_t seed, double std,
                 size_t index);

}  // namespace tessera
