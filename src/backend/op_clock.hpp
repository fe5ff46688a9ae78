#pragma once
// Where a step's time goes, by kind of op (docs/running.md, "Step breakdown"). Every op a
// backend runs is timed where it is forwarded (backend/backend.hpp, TESSERA_BACKEND_TIMED): a
// GEMM counts for the linear layer the model named before it (set_gemm), the other ops for their
// kind. The CPU's ops are synchronous, so host clocks around each call are the op's time (two
// clock reads an op: about 0.05 us, a few hundred ops a step of GPT-2 124M). A GPU's ops are queued:
// there a Recorder (backend/cuda/op_events.cu) puts an event on the stream before and after
// each op and reads the times between them once a step.
#include <array>
#include <chrono>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

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

// The slot of a layer's linear layer `gemm` in model/cost.hpp's order (qkv, proj, fc1, fc2: the
// slots' own order).
inline Slot linear_slot(int gemm) { return Slot(kQkv + gemm); }

// The breakdown's rows after the op slots, in the order metrics.jsonl and `tessera plan --json`
// both write them: each group's waits, then "other" (the rest of the step) and "step".
inline constexpr const char* kWaitNames[] = {"tp_wait", "dp_wait", "cp_wait", "ep_wait",
                                             "pp_wait", "embed_wait", "data_wait"};
using Waits = std::array<double, std::size(kWaitNames)>;
// (name, value x scale) for every row: the slots, the waits, other, step.
inline std::vector<std::pair<std::string, double>> rows(const Seconds& ops, const Waits& waits,
                                                       double other, double step, double scale) {
  std::vector<std::pair<std::string, double>> out;
  for (int k = 0; k < kSlots; ++k) out.emplace_back(kSlotNames[k], ops[size_t(k)] * scale);
  for (size_t k = 0; k < waits.size(); ++k) out.emplace_back(kWaitNames[k], waits[k] * scale);
  out.emplace_back("other", other * scale);
  out.emplace_back("step", step * scale);
  return out;
}

// Times the ops a device queues: begin and end around each op (ops never nest), collect adds the
// seconds of those recorded since its last call into `seconds`, waiting for them to finish.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void begin(int slot) = 0;
  virtual void end() = 0;
  virtual void collect(Seconds& seconds) = 0;
};

// This thread's clock: on (the engine switches it on, log.breakdown), the slot of the GEMMs that
// follow, the seconds of each slot so far, the recorder of a device's queued ops (null: host
// clocks).
struct State {
  bool enabled = false;
  int gemm = kOtherGemm;
  Seconds seconds{};
  Recorder* recorder = nullptr;
};
State& state();

inline void enable(bool on) { state().enabled = on; }
inline bool enabled() { return state().enabled; }
inline void use(Recorder* recorder) { state().recorder = recorder; }
// The linear layer whose GEMMs follow (a GEMM slot).
inline void set_gemm(Slot slot) { state().gemm = slot; }
// Each slot's seconds so far (a recorder's ops waited for and added first).
inline const Seconds& seconds() {
  State& s = state();
  if (s.recorder != nullptr) s.recorder->collect(s.seconds);
  return s.seconds;
}

// Times one op into its slot while the clock is on.
class Scope {
 public:
  explicit Scope(int slot) {
    State& s = state();
    if (!s.enabled) return;
    slot_ = slot == kGemm ? s.gemm : slot;
    if (s.recorder != nullptr) s.recorder->begin(slot_);
    else start_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (slot_ < 0) return;
    State& s = state();
    if (s.recorder != nullptr) {
      s.recorder->end();
    } else {
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
      s.seconds[size_t(slot_)] += d.count();
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int slot_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera::op_clock
