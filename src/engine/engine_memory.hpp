#pragma once
// Every buffer an engine (engine/engine.cpp) allocates, declared in its Arena: the model chunks'
// activations, the optimizer's moments, the pipeline's send buffers, the parameters, gradients and
// token buffers, and under ZeRO-2/3 the transient buffers of the sharded weights. The engine
// builds it over its communicators; `tessera plan` (engine/memory.cpp) builds the same over
// DeclareBackend (backend/declare.hpp) and communicators of the right size without MPI, and
// reads the arena's byte counts: one accounting, so the plan and the run cannot disagree.
//
// What the parameters and gradients take by ZeRO stage (P: the tile's elements, padded to the
// group under ZeRO-1; S: this rank's slice P/n under ZeRO-1, its parts ShardPlan::total under 2
// and 3 and under ZeRO-1 with expert parallelism, which also gathers through one unit), beside
// the update rule's state (optim/distributed.hpp: AdamW's two moments S each):
//   0     fp32 master P, gradients P, bf16 copy P
//   1     fp32: parameters P (the master); bf16: copy P, master S; gradients P
//   2     fp32: parameters P (the master); bf16: copy P, master S; gradient sums S
//   3     master S, bf16 copy S; gradient sums S
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/arena.hpp"
#include "engine/engine.hpp"
#include "model/gpt.hpp"
#include "optim/distributed.hpp"
#include "optim/sharded_weights.hpp"
#include "pipeline/executor.hpp"

namespace tessera {

template <class Backend>
struct EngineMemory {
  using Act = typename Backend::Act;
  using Comm = typename Backend::Comm;

  // comms: the engine's communicators (only their size and rank are read here); world: every
  // rank (the gradient norm).
  EngineMemory(const EngineSetup& s, Arena& arena, const EngineComms<Comm>& comms,
               ::tessera::Comm* world)
      : models(make_models(s, arena, comms.tp, comms.cp, comms.ep)),
        plan(s.zero >= 2 || (s.zero == 1 && s.tile.ep > 1)
                 ? make_shard_plan(s.tile, comms.shard->size(), comms.shard->rank(),
                                   comms.expert_shard->size(), comms.expert_shard->rank())
                 : make_shard_plan(s.tile, 1, 0)),
        optimizer(s.tile, {comms.grads, comms.shard, comms.replica, world, comms.tp,
                           comms.expert_grads, comms.expert_shard, comms.ep}, s.zero,
                  &plan, s.hyper, arena),
        sharded(s.zero >= 2 ? std::make_unique<ShardedBuffers>(
                                  s.tile, plan, s.zero, s.reshard_after_forward, s.model.fp8.on,
                                  sizeof(Act), arena)
                            : nullptr),
        executor(model_pointers(), comms.pp, s.schedule, s.micro_batch, s.seq_len, arena) {
    constexpr bool kFp32 = std::is_same_v<Act, float>;
    const int stage = optimizer.stage();
    const size_t full = optimizer.buffer_size(), parts = plan.total;
    step_tokens = size_t(s.n_micro) * s.micro_batch * s.seq_len;
    if (stage <= 1) {
      h_master = optimizer.master_sharded()
                     ? arena.add("master weights (fp32, this rank's slice)",
                                 optimizer.shard_elements() * sizeof(float))
                     : arena.add("parameters (fp32 master)", full * sizeof(float));
      h_grads = arena.add("gradients (fp32)", full * sizeof(float));
      if (!kFp32) h_copy = arena.add("parameters (bf16 copy)", full * sizeof(Act));
    } else {
      if (stage == 2 && kFp32)
        h_master = arena.add("parameters (fp32, the master)", full * sizeof(float));
      else
        h_master = arena.add("master weights (fp32, this rank's parts)", parts * sizeof(float));
      h_grads = arena.add("gradient sums (fp32, this rank's parts)", parts * sizeof(float));
      if (!kFp32)
        h_copy = stage == 2 ? arena.add("parameters (bf16)", full * sizeof(Act))
                            : arena.add("parameters (bf16, this rank's parts)", parts * sizeof(Act));
    }
    h_tokens = arena.add("step input tokens", step_tokens * sizeof(int32_t));
    h_targets = arena.add("step target tokens", step_tokens * sizeof(int32_t));
    h_losses = arena.add("step losses", step_tokens * sizeof(float));
    if (s.model.document_mask)
      h_doc_start = arena.add("step document starts and positions",
                              2 * step_tokens * sizeof(int32_t));
  }

  // The activations and statistics of every chunk (Gpt::activation_bytes).
  size_t activation_bytes() const {
    size_t bytes = 0;
    for (const auto& model : models) bytes += model->activation_bytes();
    return bytes;
  }
  // ZeRO-2/3's gathered parameters and gradient buffers (0 otherwise).
  size_t transient_bytes() const { return sharded ? sharded->bytes() : 0; }
  // The parameters' buffers: the master, the bf16 copy, and FP8's weight codes and their
  // transposes (model/fp8.hpp), counted with the parameters.
  size_t param_bytes(const Arena& arena) const {
    size_t bytes = arena.bytes(h_master) + (h_copy ? arena.bytes(h_copy) : 0);
    for (const auto& model : models) bytes += model->fp8_weight_bytes();
    return bytes;
  }

  // The fp32 state the host reads and writes (initialisation, checkpoints): the engine's own
  // buffer where the master is host memory laid out as the state, else a host copy of it.
  // (ZeRO-2 and ZeRO-1 with ep keep the fp32 master whole, their state by parts.)
  bool host_state_is_master(bool host_memory) const {
    return host_memory && (optimizer.stage() == 3 || !optimizer.by_parts());
  }
  // TrainEngine::host_bytes: on a host backend the arena, plus the host copies of the step's
  // losses and (off the host, or the parts of a whole master) of the parameters.
  size_t host_bytes(const Arena& arena, bool host_memory) const {
    return (host_memory ? arena.total_bytes() : 0) + step_tokens * sizeof(float) +
           (host_state_is_master(host_memory) ? 0 : optimizer.state_size() * sizeof(float));
  }

  // One model per chunk of layers (virtual stages), each with the slots its chunk's schedule keeps.
  std::vector<std::unique_ptr<Gpt<Backend>>> models;
  ShardPlan plan;  // by parts (ZeRO-2/3, 1 with ep): this rank's parts (one of n = 1 otherwise)
  DistributedOptimizer<Backend> optimizer;
  std::unique_ptr<ShardedBuffers> sharded;  // ZeRO-2/3's transient buffers
  PipelineExecutor<Backend> executor;
  size_t step_tokens = 0;
  size_t h_master = 0, h_grads = 0, h_copy = 0, h_tokens = 0, h_targets = 0, h_losses = 0;
  size_t h_doc_start = 0;

 private:
  std::vector<std::unique_ptr<Gpt<Backend>>> make_models(const EngineSetup& s, Arena& arena,
                                                        Comm* tp, Comm* cp, Comm* ep) {
    std::vector<std::unique_ptr<Gpt<Backend>>> out;
    for (int c = 0; c < int(s.tile.chunks.size()); ++c)
      out.push_back(std::make_unique<Gpt<Backend>>(s.tile, tp, s.micro_batch, s.seq_len,
                                                   schedule_slots(s.schedule, c), arena, s.model,
                                                   c, cp, ep));
    return out;
  }
  std::vector<Gpt<Backend>*> model_pointers() {
    std::vector<Gpt<Backend>*> out;
    for (auto& model : models) out.push_back(model.get());
    return out;
  }
};

}  // namespace tessera
