#pragma once
// A mixture-of-experts router's rule (model.moe), read by the routing ops of each backend
// (moe_route_forward / moe_route_backward / moe_router_stats in backend/cpu/ops.hpp and
// backend/cuda/ops.hpp). Per token (a row of the router's logits l, E of them):
//   scores  s = softmax(l), or sigmoid(l) element-wise (DeepSeek-V3, Qwen3-style: sigmoid)
//   choice  the top_k experts by s + bias (bias: DeepSeek-V3's auxiliary-loss-free balancing,
//           used for the choice only, or none); ties go to the lower expert index, so every
//           layout routes the same token the same way
//   gates   s at the chosen experts, divided by their sum when renormalize
// The balancing losses read the scores normalised per token, p = s / Σ s (p = s for softmax):
//   auxiliary (Switch, GShard; Megatron's switch_load_balancing_loss):
//       L_aux = coef · E / (k · N²) · Σ_e (Σ_t p[t,e]) · c_e     c_e: tokens routed to e
//   z-loss (ST-MoE):  L_z = coef_z / N · Σ_t (logsumexp l[t])²
namespace tessera {

struct MoeRouting {
  int experts = 0;   // E
  int top_k = 1;     // k <= E
  bool sigmoid = false;
  bool renormalize = true;
};

}  // namespace tessera
