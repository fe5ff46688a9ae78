#pragma once
// Where a model chunk (model/gpt.hpp) reads its parameters and adds its gradients: unit by unit
// (LocalLayout::units: a layer, or one tensor outside the layers), each acquired just before the
// unit's compute and released once that compute is issued. A unit's pointer is its first
// element, laid out as the local buffer lays it out (a tensor is at + offset - unit.begin).
//
// Without sharded parameters or gradients (ZeRO 0 and 1) the units are the flat local buffers
// themselves (FlatWeights). ZeRO-2 and 3 (optim/sharded_weights.hpp) hand out the unit's
// gradients in a zeroed buffer and reduce-scatter them to their owners on release; ZeRO-3 also
// gathers the unit's parameters on acquire. The pass's order (pass()) lets them start the next
// unit's gather while this one computes.
#include <cstdint>
#include <vector>

#include "model/shard.hpp"

namespace tessera {

template <class Act>
class Weights {
 public:
  virtual ~Weights() = default;
  // The units whose parameters the pass about to run reads, in its order (a unit may come twice:
  // the tied embedding is the head too).
  virtual void pass(const std::vector<int>& units) = 0;
  virtual const Act* params(int unit) = 0;
  virtual void params_done(int unit) = 0;
  // ZeRO-3 with FP8 (CodesUnit, model/shard.hpp): the held unit's FP8 GEMM weights as their
  // codes, one byte per element laid out as params(unit) lays out the values (which it then
  // holds for the unit's other tensors only); null where the unit came as values.
  virtual const uint8_t* codes(int) { return nullptr; }
  // The unit's gradients, added to by the pass; a forward-only pass never asks.
  virtual float* grads(int unit) = 0;
  virtual void grads_done(int unit) = 0;
};

// The flat local buffers (params, and grads; grads may be null for forward-only passes).
template <class Act>
class FlatWeights final : public Weights<Act> {
 public:
  FlatWeights(const LocalLayout& layout, const Act* params, float* grads)
      : units_(layout.units), params_(params), grads_(grads) {}
  void pass(const std::vector<int>&) override {}
  const Act* params(int unit) override { return params_ + units_[size_t(unit)].begin; }
  void params_done(int) override {}
  float* grads(int unit) override { return grads_ + units_[size_t(unit)].begin; }
  void grads_done(int) override {}

 private:
  const std::vector<Unit>& units_;
  const Act* params_;
  float* grads_;
};

}  // namespace tessera
