#include "model/mlp.hpp"

#include <string>

namespace tessera {

void mlp_params(MlpKind kind, bool bias, Init out_init, size_t C, size_t F,
                std::vector<LayerParam>* out, const std::string& prefix) {
  // fc1's tensors in the order its output columns take them (the local shards sit next to each
  // other, so one GEMM computes them all).
  std::vector<std::string> fc1;
  std::string fc2;
  switch (kind) {
    case MlpKind::Gelu: fc1 = {prefix + "c_fc"}, fc2 = prefix + "c_proj"; break;
    case MlpKind::SwiGlu:
      fc1 = {prefix + "gate_proj", prefix + "up_proj"}, fc2 = prefix + "down_proj";
      break;
  }
  for (const std::string& name : fc1)
    out->push_back({kFc1W, name + ".weight", {F, C}, Init::Normal, Split::Rows});
  if (bias)
    for (const std::string& name : fc1)
      out->push_back({kFc1B, name + ".bias", {F}, Init::Zeros, Split::Rows});
  out->push_back({kFc2W, fc2 + ".weight", {C, F}, out_init, Split::Columns});
  if (bias) out->push_back({kFc2B, fc2 + ".bias", {C}, Init::Zeros, Split::Replicated});
}

void moe_params(MlpKind kind, bool bias, Init out_init, size_t C, size_t F, size_t E,
                std::vector<LayerParam>* out) {
  out->push_back({kRouterW, "mlp.router.weight", {E, C}, Init::Normal, Split::Replicated});
  std::string fc1, fc2;
  switch (kind) {
    case MlpKind::Gelu: fc1 = "mlp.experts.c_fc", fc2 = "mlp.experts.c_proj"; break;
    case MlpKind::SwiGlu: fc1 = "mlp.experts.gate_up_proj", fc2 = "mlp.experts.down_proj"; break;
  }
  // fc1's row blocks: each expert's F rows (SwiGLU: its gate's and its up's), each split over tp.
  const size_t rows = size_t(mlp_fc1_columns(kind, int(F))), parts = E * rows / F;
  out->push_back(
      {kExpertFc1W, fc1 + ".weight", {E * rows, C}, Init::Normal, Split::PartRows, int(parts)});
  if (bias)
    out->push_back(
        {kExpertFc1B, fc1 + ".bias", {E * rows}, Init::Zeros, Split::PartRows, int(parts)});
  out->push_back({kExpertFc2W, fc2 + ".weight", {E * C, F}, out_init, Split::Columns});
  if (bias) out->push_back({kExpertFc2B, fc2 + ".bias", {E * C}, Init::Zeros, Split::Replicated});
}

int mlp_fc1_columns(MlpKind kind, int f) {
  switch (kind) {
    case MlpKind::Gelu: return f;
    case MlpKind::SwiGlu: return 2 * f;
  }
  return f;
}

int mlp_default_width(MlpKind kind, int C, int multiple) {
  switch (kind) {
    case MlpKind::Gelu: return 4 * C;
    case MlpKind::SwiGlu: {
      const long f = (8L * C + 2) / 3;
      return int((f + multiple - 1) / multiple * multiple);
    }
  }
  return 4 * C;
}

}  // namespace tessera
