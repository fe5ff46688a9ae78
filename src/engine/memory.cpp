#include "engine/memory.hpp"

#include "backend/declare.hpp"
#include "common/files.hpp"
#include "engine/engine_memory.hpp"

namespace tessera {

namespace {

template <class Act>
RankMemory count(const Config& cfg, const ModelShape& shape, const RunLayout& run, int dp_rank,
                 int tp_rank, int pp_rank, bool gpu) {
  using Backend = DeclareBackend<Act>;
  const ParallelLayout& l = run.layout;
  const LocalLayout tile = rank_tile(run, shape, tp_rank, pp_rank);
  const EngineSetup setup = engine_setup(cfg, run, tile, pp_rank);
  // dp_rank: the rank in dp x cp (the gradients' group; the dp rank when cp = 1), cp fastest.
  const int group = l.shard_size();
  Comm tp = Comm::shape(l.tp, tp_rank), dp = Comm::shape(l.dpcp(), dp_rank),
       pp = Comm::shape(l.pp, pp_rank), shard = Comm::shape(group, dp_rank % group),
       replica = Comm::shape(l.dpcp() / group, dp_rank / group),
       cp = Comm::shape(l.cp, dp_rank % l.cp);
  Arena arena(Backend::memory());
  const EngineMemory<Backend> mem(setup, arena, &tp, &dp, &pp, &shard, &replica, &cp);
  RankMemory m;
  m.pp_rank = pp_rank;
  m.tp_rank = tp_rank;
  m.dp_rank = dp_rank;
  m.param_elems = tile.total;
  m.params = arena.bytes(mem.h_master) + (mem.h_copy ? arena.bytes(mem.h_copy) : 0);
  m.grads = arena.bytes(mem.h_grads);
  m.moments = mem.optimizer.moment_bytes();
  m.activations = mem.activation_bytes();
  m.arena = arena.total_bytes();
  m.engine_host = mem.host_bytes(arena, /*host_memory=*/!gpu);
  m.optimizer = mem.optimizer.declared_bytes();
  m.transient = mem.transient_bytes();
  m.pipeline = mem.executor.send_buffer_bytes();
  // FP8: each GEMM weight's one-byte codes and their transpose (model/fp8.hpp), counted with the
  // parameters.
  for (const auto& model : mem.models) m.fp8 += model->fp8_weight_bytes();
  m.params += m.fp8;
  m.other = m.arena - m.params - m.grads - m.optimizer - m.activations - m.transient;
  m.loader = (tile.first || tile.last) ? loader_ring_bytes(cfg, run) : 0;
  m.buffer_size = uint64_t(mem.optimizer.buffer_size());
  m.state_size = uint64_t(mem.optimizer.state_size());
  // The rule's state as host buffers (state_host_layout), and the parameters for an
  // asynchronous write's snapshot.
  m.checkpoint = (cfg.checkpoint.async ? 1 : 0) * m.state_size * sizeof(float);
  for (const StateSpec& spec : mem.optimizer.state_specs())
    m.checkpoint += state_host_layout(spec, mem.optimizer.state_layout(), m.state_size).total *
                    sizeof(float);
  for (size_t c = 0; c < tile.chunks.size(); ++c)
    m.in_flight += mem.models[c]->slots();
  return m;
}

}  // namespace

RankMemory rank_memory(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                       int dp_rank, int tp_rank, int pp_rank, bool gpu, bool bf16) {
  return bf16 ? count<Bf16Bytes>(cfg, shape, run, dp_rank, tp_rank, pp_rank, gpu)
              : count<float>(cfg, shape, run, dp_rank, tp_rank, pp_rank, gpu);
}

std::string memory_line(const RankMemory& m, const std::string& total_of) {
  return "stage " + std::to_string(m.pp_rank) + " tp " + std::to_string(m.tp_rank) +
         ": parameters " + human_bytes(double(m.params)) + ", gradients " +
         human_bytes(double(m.grads)) + ", optimizer " + human_bytes(double(m.optimizer)) +
         ", activations " + human_bytes(double(m.activations)) + " (" +
         std::to_string(m.in_flight) + " micro-batch" + (m.in_flight > 1 ? "es" : "") +
         " in flight), " +
         (m.transient > 0 ? "ZeRO transient " + human_bytes(double(m.transient)) + ", " : "") +
         "other " + human_bytes(double(m.other)) + ", loader " +
         human_bytes(double(m.loader)) + ": " + human_bytes(double(m.arena)) + " allocated" +
         (total_of.empty() ? "" : " " + total_of);
}

}  // namespace tessera
