#pragma once
// Where a step's time goes, by kind of op (docs/running.md, "Step breakdown"). Every op a
// backend runs is timed where it is forwarded (backend/backend.hpp, TESSERA_BACKEND_TIMED): a
// GEMM counts for the linear layer the model named before it (set_gemm), the other ops for their
// kind. The CPU's ops are synchronous, so host clocks around each call are the op's time (two
// clock reads an op: about 0.05 us, some 400 ops a step of GPT-2 124M); a GPU's ops are queued,
// so there the clock is off (enabled() false) until the breakdown reads events on the stream.
#include <array>
#include <chrono>

namespace tessera::op_clock {

enum Slot {
  kQkv, kProj, kFc1, kFc2, kHead, kExperts, kOtherGemm,  // GEMMs, by linear layer
  kAttention, kNorms, kElementwise, kEmbedding, kCrossEntropy, kRouting, kFp8Casts, kOptimizer,
  kSlots,
  kGemm = kSlots  // in TESSERA_BACKEND_TIMED: the slot set_gemm named
};
// The slots' names in metrics.jsonl and the log's table.
inline constexpr const char* kSlotNames[kSlots] = {
    "qkv",       "attn_proj", "mlp_up",    "mlp_down",      "lm_head",     "experts",
    "other_gemm", "attention", "norms",    "elementwise",   "embedding",   "cross_entropy",
    "moe_routing", "fp8_casts", "optimizer"};

using Seconds = std::array<double, kSlots>;

// This thread's clock: on (the engine of a host backend switches it on), the slot of the GEMMs
// that follow, the seconds of each slot so far.
struct State {
  bool enabled = false;
  int gemm = kOtherGemm;
  Seconds seconds{};
};
State& state();

inline void enable(bool on) { state().enabled = on; }
inline bool enabled() { return state().enabled; }
// The linear layer whose GEMMs follow (a GEMM slot).
inline void set_gemm(Slot slot) { state().gemm = slot; }
inline const Seconds& seconds() { return state().seconds; }

// Times one op into its slot while the clock is on.
class Scope {
 public:
  explicit Scope(int slot) {
    State& s = state();
    if (!s.enabled) return;
    slot_ = slot == kGemm ? s.gemm : slot;
    start_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (slot_ < 0) return;
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
    state().seconds[size_t(slot_)] += d.count();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int slot_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera::op_clock
