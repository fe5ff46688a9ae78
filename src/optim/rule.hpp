#pragma once
// The optimizer seam (DESIGN §6): an update rule declares its state tensors (name, element type,
// shape rule) and its update; the distribution strategy (optim/distributed.hpp: ZeRO 0-3,
// hybrid groups) holds and shards whatever state the rule declares, and checkpoints store it by
// the rule's names (/optim/<state>/<tensor>, io/checkpoint.hpp).
//
//   rule        state                                    optim.name
//   AdamW       exp_avg, exp_avg_sq: like the parameters   adamw (optim/adamw.hpp)
//   Adafactor   exp_avg (beta1 > 0) like the parameters;   adafactor (optim/adafactor.hpp)
//               exp_avg_sq_row [R], exp_avg_sq_col [C] of
//               each matrix; exp_avg_sq of each vector
//
// A shape rule says what one tensor's state is: Elementwise (one value per parameter: sharded
// with the parameters, ZeRO's slice or parts of them) or Rows / Cols (one value per canonical row
// or column of a matrix: small, held whole by every rank holding a piece of the matrix, and made
// the same on all of them by the rule's reductions). `of` says which tensors have it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/adafactor.hpp"
#include "backend/adamw.hpp"
#include "config/config.hpp"
#include "model/shard.hpp"

namespace tessera {

enum class StateShape { Elementwise, Rows, Cols };
enum class StateOf { Every, Matrices, Vectors };

struct StateSpec {
  std::string name;                  // the checkpoint's group: /optim/<name>/<tensor>
  StateShape shape = StateShape::Elementwise;
  StateOf of = StateOf::Every;
  const char* dtype = "float32";     // the element type (every state is fp32 today)
  bool non_negative = false;         // a second moment: a negative value is a damaged file
  // Whether canonical tensor c has this state, its dataset's shape, and its elements.
  bool holds(const ParamTensor& c) const;
  std::vector<size_t> shape_of(const ParamTensor& c) const;
  size_t numel(const ParamTensor& c) const;
  bool whole() const { return shape != StateShape::Elementwise; }
};

// The host copy of one state tensor for the tensors of `layout` (initialisation, checkpoints):
// Elementwise at each tensor's offset of a buffer of `elementwise_total` elements (the state
// size: the layout's, padded under ZeRO-1); Rows / Cols one whole vector per tensor that has it,
// one after another in the layout's order. offset[i] = kNone where tensor i has none.
struct StateHostLayout {
  static constexpr size_t kNone = SIZE_MAX;
  std::vector<size_t> offset;
  size_t total = 0;
};
StateHostLayout state_host_layout(const StateSpec& spec, const LocalLayout& layout,
                                  size_t elementwise_total);

// optim.*: the rule's name and every rule's hyper-parameters.
struct OptimHyper {
  OptimHyper() = default;
  OptimHyper(const AdamWHyper& a) : adamw(a) {}  // NOLINT: AdamW's, as tests and benches give it
  OptimRule rule = OptimRule::AdamW;
  AdamWHyper adamw;
  AdafactorHyper adafactor;
};

// The rules this tessera knows ("adamw", "adafactor"), and the one a checkpoint's /optim rule
// attribute names (false when unknown).
bool known_rule(const std::string& name);
bool rule_named(const std::string& name, OptimRule* rule);
// The state the rule of `hyper` declares, in order.
std::vector<StateSpec> rule_state(const OptimHyper& hyper);
// Every state the rule called `name` can declare (any hyper-parameters); empty when unknown.
std::vector<StateSpec> rule_state_names(const std::string& name);

// What a rule declares before anything is allocated: its state, and working buffers of its own
// (bytes, by name) beyond it; `tessera plan` counts both.
struct RulePlan {
  std::vector<StateSpec> state;
  std::vector<std::pair<std::string, size_t>> work;
};
RulePlan plan_rule(const OptimHyper& hyper, const LocalLayout& tile);

// One piece of this rank's update: n elements of tile tensor `tensor`, at index `local` of the
// tile's buffer and at index `state` of this rank's state (ZeRO's slice or parts).
struct Piece {
  int tensor = 0;
  size_t local = 0, state = 0, n = 0;
};

// A step's view of this rank's pieces (each vector indexed by piece): where its master weights,
// bf16 copy (nullptr without one) and reduced gradients are; and state[k] where the k-th declared
// state is: Elementwise by piece, at its first element; Rows / Cols by tile tensor, its whole
// vector (every matrix of the tile has one, whether this rank updates a piece of it or not);
// nullptr where the tensor has none.
template <class Backend>
struct StepView {
  std::vector<float*> master;
  std::vector<typename Backend::Act*> copy;
  std::vector<const float*> grads;
  const std::vector<std::vector<float*>>* state = nullptr;
};

// What a rule is built from: the tile, this rank's pieces, the communicators over which the
// ranks holding pieces of one canonical tensor sum (tp, and the ZeRO group where it splits the
// buffer; without ZeRO the ep group where the ranks hold different experts' rows; nullptr where
// nothing is split), and its working buffers (RulePlan::work, allocated).
template <class Backend>
struct RuleSetup {
  const LocalLayout* tile = nullptr;
  const std::vector<Piece>* pieces = nullptr;
  typename Backend::Comm* tp = nullptr;
  typename Backend::Comm* shard = nullptr;
  typename Backend::Comm* ep = nullptr;
  std::vector<void*> work;
};

template <class Backend>
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // One update of every piece at learning rate lr, 1-based step t of the rule's state. The
  // gradients are reduced and clipped.
  virtual void step(const StepView<Backend>& view, double lr, long t) = 0;
};

template <class Backend>
std::unique_ptr<UpdateRule<Backend>> make_rule(const OptimHyper& hyper,
                                               const RuleSetup<Backend>& setup);

}  // namespace tessera
