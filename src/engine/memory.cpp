#include "engine/memory.hpp"

#include "backend/declare.hpp"
#include "common/files.hpp"
#include "engine/engine_memory.hpp"

namespace tessera {

namespace {

template <class Act>
RankMemory count(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                 long long world_rank, bool gpu) {
  using Backend = DeclareBackend<Act>;
  const MeshShape mesh = mesh_shape(run.layout);
  const int tp_rank = mesh.coord(world_rank, "tp"), pp_rank = mesh.coord(world_rank, "pp");
  const LocalLayout tile = rank_tile(run, shape, tp_rank, pp_rank,
                                     mesh.has("ep") ? mesh.coord(world_rank, "ep") : 0);
  const EngineSetup setup = engine_setup(cfg, run, tile, pp_rank);
  // The engine's communicators (EngineComms) as the mesh's arithmetic sizes and places them.
  auto group = [&](const DimNames& dims) {
    return Comm::shape(mesh.group_size(dims), mesh.group_rank(world_rank, dims));
  };
  Comm tp = group({"tp"}), grads = group({"dp", "cp"}), pp = group({"pp"}),
       shard = group({"shard"}), replica = group({"replica"}), cp = group({"cp"});
  const bool ep_view = mesh.has("ep");
  Comm ep = ep_view ? group({"ep"}) : Comm::shape(1, 0);
  // (The optimizer tells expert parallelism by expert_grads being another communicator.)
  Comm edp = ep_view ? group({"eshard", "ereplica"}) : Comm::shape(1, 0);
  Comm eshard = ep_view ? group({"eshard"}) : Comm::shape(1, 0);
  Arena arena(Backend::memory());
  const EngineMemory<Backend> mem(setup, arena,
                                  {&tp, &grads, &pp, &shard, &replica, &cp, &ep,
                                   ep_view ? &edp : &grads, ep_view ? &eshard : &grads},
                                  nullptr);
  RankMemory m;
  m.pp_rank = pp_rank;
  m.tp_rank = tp_rank;
  m.dp_rank = grads.rank();
  m.param_elems = tile.total;
  m.params = mem.param_bytes(arena);
  m.grads = arena.bytes(mem.h_grads);
  m.moments = mem.optimizer.moment_bytes();
  m.activations = mem.activation_bytes();
  m.arena = arena.total_bytes();
  m.engine_host = mem.host_bytes(arena, /*host_memory=*/!gpu);
  m.optimizer = mem.optimizer.declared_bytes();
  m.transient = mem.transient_bytes();
  m.pipeline = mem.executor.send_buffer_bytes();
  for (const auto& model : mem.models) m.fp8 += model->fp8_weight_bytes();
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
  if (shape.moe.experts == 0) return m;  // (the planner's search counts thousands of layouts)
  m.expert_elems = tile.expert_elements();
  for (int k = 0; k < RankMemory::kMoeBuffers; ++k)
    m.moe_buffers[k] = arena.bytes_named(RankMemory::kMoeBufferNames[k]);
  return m;
}

}  // namespace

RankMemory rank_memory(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                       long long world_rank, EngineKind kind) {
  return bf16_activations(kind) ? count<Bf16Bytes>(cfg, shape, run, world_rank, on_gpu(kind))
                                : count<float>(cfg, shape, run, world_rank, on_gpu(kind));
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
