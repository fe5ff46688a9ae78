#pragma once
// Every buffer an engine (engine/engine.cpp) allocates, declared in its Arena: the model chunks'
// activations, the optimizer's moments, the pipeline's send buffers, the master weights,
// gradients and token buffers. The engine builds it over its communicators; `tessera plan`
// (engine/memory.cpp) builds the same over DeclareBackend (backend/declare.hpp) and communicators
// of the right size without MPI, and reads the arena's byte counts: one accounting, so the plan
// and the run cannot disagree.
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/arena.hpp"
#include "engine/engine.hpp"
#include "model/gpt.hpp"
#include "optim/distributed.hpp"
#include "pipeline/executor.hpp"

namespace tessera {

template <class Backend>
struct EngineMemory {
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // tp, dp, pp: the engine's communicators (only their size and rank are read here).
  EngineMemory(const EngineSetup& s, Arena& arena, Comm* tp, Comm* dp, Comm* pp)
      : models(make_models(s, arena, tp)), optimizer(s.tile, dp, s.world, s.zero, s.hyper, arena),
        executor(model_pointers(), pp, s.schedule, s.micro_batch, s.seq_len, arena) {
    const size_t n = optimizer.buffer_size();
    step_tokens = size_t(s.n_micro) * s.micro_batch * s.seq_len;
    h_master = arena.add("parameters (fp32 master)", n * sizeof(float));
    h_grads = arena.add("gradients (fp32)", n * sizeof(float));
    if (!std::is_same_v<Act, float>) h_copy = arena.add("parameters (bf16 copy)", n * sizeof(Act));
    h_tokens = arena.add("step input tokens", step_tokens * sizeof(int32_t));
    h_targets = arena.add("step target tokens", step_tokens * sizeof(int32_t));
    h_losses = arena.add("step losses", step_tokens * sizeof(float));
  }

  // The activations and statistics of every chunk (Gpt::activation_bytes).
  size_t activation_bytes() const {
    size_t bytes = 0;
    for (const auto& model : models) bytes += model->activation_bytes();
    return bytes;
  }

  // TrainEngine::host_bytes: on a host backend the arena, plus the host copies of the step's
  // losses and (off the host) of the parameters.
  size_t host_bytes(const Arena& arena, bool host_memory) const {
    return (host_memory ? arena.total_bytes() : 0) + step_tokens * sizeof(float) +
           (host_memory ? 0 : optimizer.buffer_size() * sizeof(float));
  }

  // One model per chunk of layers (virtual stages), each with the slots its chunk's schedule keeps.
  std::vector<std::unique_ptr<Gpt<Backend>>> models;
  DistributedOptimizer<Backend> optimizer;
  PipelineExecutor<Backend> executor;
  size_t step_tokens = 0;
  size_t h_master = 0, h_grads = 0, h_copy = 0, h_tokens = 0, h_targets = 0, h_losses = 0;

 private:
  std::vector<std::unique_ptr<Gpt<Backend>>> make_models(const EngineSetup& s, Arena& arena,
                                                        Comm* tp) {
    std::vector<std::unique_ptr<Gpt<Backend>>> out;
    for (int c = 0; c < int(s.tile.chunks.size()); ++c)
      out.push_back(std::make_unique<Gpt<Backend>>(s.tile, tp, s.micro_batch, s.seq_len,
                                                   schedule_slots(s.schedule, c), arena, s.model,
                                                   c));
    return out;
  }
  std::vector<Gpt<Backend>*> model_pointers() {
    std::vector<Gpt<Backend>*> out;
    for (auto& model : models) out.push_back(model.get());
    return out;
  }
};

}  // namespace tessera
