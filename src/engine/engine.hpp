#pragma once
// What the trainer's one step loop (train/trainer.cpp) asks of a backend: the model's forward and
// backward through the pipeline executor, the gradient reductions, the optimizer step,
// evaluation, and where the parameters and the optimizer's state live. The loop itself (stop
// requests, data loader, logging, evaluation and checkpoint cadence, metrics) does not depend on
// it.
//
// One implementation, Engine<B> (engine.cpp), over a backend B (backend/backend.hpp): the model,
// the pipeline executor and the distributed optimizer of that backend, its communicators made
// from the mesh's groups in a fixed order, and every buffer in one Arena.
// make_engine picks CpuBackend or CudaBackend<float | bf16>.
//
// Checkpoints stay fp32 and host-side on every backend: host_params() and get_optim_state() are
// full local fp32 buffers in the layout's offsets, so a run restarts on any backend.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.hpp"
#include "backend/op_clock.hpp"
#include "config/config.hpp"
#include "io/token_source.hpp"
#include "model/fp8.hpp"
#include "model/options.hpp"
#include "model/shard.hpp"
#include "optim/rule.hpp"
#include "parallel/comm.hpp"
#include "parallel/mesh.hpp"
#include "parallel/traffic.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

// What an engine is built from: the rank's tile, the mesh its communicators come from, the
// stage's schedule and the step's shape. Built with designated initializers (engine_setup).
struct EngineSetup {
  const LocalLayout& tile;
  // The trainer's mesh (parallel/mesh.hpp): the engine makes every communicator of its own from
  // one of its groups (engine.cpp, "the groups"). nullptr where nothing communicates: `tessera
  // plan` counting an engine, `tessera sample` on one rank.
  const Mesh* mesh = nullptr;
  std::vector<Action> schedule = {};
  // seq_len: this rank's tokens of each sequence, T / cp (the loader's batches hold all T).
  int micro_batch = 1, seq_len = 1, n_micro = 1;
  int zero = 0;            // parallel.zero: the ZeRO stage (optim/distributed.hpp)
  bool embed_sum = false;  // pp > 1: stage 0's wte and the last stage's copy sum their gradients
  OptimHyper hyper = {};   // optim.*: the update rule and its hyper-parameters (optim/rule.hpp)
  ModelOptions model = {};  // attention, recompute (model/options.hpp)
  bool reshard_after_forward = true;  // ZeRO-3 (parallel.reshard_after_forward)
  bool zero_prefetch = true;          // ZeRO-3 (parallel.zero_prefetch)
  bool nccl_overlap = true;           // device.nccl_overlap: dp and ZeRO collectives on own streams
  Breakdown breakdown = Breakdown::Auto;  // log.breakdown: time the ops by kind (op_clock)
  // model.document_mask: the data's end-of-text id, after which a document starts.
  int64_t document_eot = -1;
};

// The communicators an engine's parts use (its model chunks, optimizer, executor), each the
// backend's twin of one mesh group: tp {tp}, grads {dp, cp} (the ranks holding the same
// parameters: the gradients reduce, and ZeRO shards, over them), pp {pp}, shard and replica
// (ZeRO's view of dp x cp: the group that splits the state, and the groups holding the same
// part; without hybrid sharding shard is grads and replica one rank), cp {cp}. `tessera plan`
// gives communicators of the right size and rank, without MPI.
template <class C>
struct EngineComms {
  C *tp, *grads, *pp, *shard, *replica, *cp;
  // Expert parallelism: the ranks splitting the experts, those holding the same experts (the
  // experts' gradients reduce over them; grads itself without ep), and those of them in one ZeRO
  // group, which split the experts' state (expert_grads itself without hybrid sharding).
  C *ep, *expert_grads, *expert_shard;
};

// A micro-batch's tokens and targets (B,T) in host memory (the loader's ring), nullptr where the
// stage reads no tokens (under data.document_mask every stage reads them: the attention's mask
// comes from the tokens). Whole sequences: under context parallelism the engine takes its
// chunks.
struct HostMicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;

  // The host memory the engine allocates (every buffer on the CPU; host copies of the parameters
  // and losses on a GPU, whose own memory the CUDA arena checks when it allocates).
  virtual size_t host_bytes() const = 0;
  // Allocates the declared buffers (make_engine(..., allocate = false)); the engine is usable
  // from then on.
  virtual void allocate() = 0;
  // The state this rank holds of the parameters' master weights and moments, as the host sees
  // it (host_params(), get_optim_state): its elements (DistributedOptimizer::state_size) and their
  // layout, the tile or under ZeRO-2/3 this rank's parts of it (ShardPlan::layout), which
  // initialisation and checkpoints read and write; and whether this rank writes it into a
  // checkpoint (one rank of those holding the same state: dp rank 0, or under ZeRO-2/3 the
  // first replica's).
  virtual size_t state_size() const = 0;
  virtual const LocalLayout& state_layout() const = 0;
  virtual bool writes_state() const = 0;
  virtual size_t moment_bytes() const = 0;
  virtual size_t activation_bytes() const = 0;
  // What its arena holds for the parameters (master and bf16 copy), the gradients, the optimizer
  // (moments, ZeRO-1's gradient slice, the norm) and ZeRO-2/3's transient buffers: the persistent
  // bytes per rank that the ZeRO stages shrink (engine/engine_memory.hpp).
  struct Footprint {
    size_t params = 0, grads = 0, optimizer = 0, transient = 0;
    size_t arena = 0;  // every buffer: the rank's peak (activations included)
    size_t pipeline = 0;  // the pipeline's backward send buffers
  };
  virtual Footprint footprint() const = 0;
  // Lines for rank 0's start-up log: what the backend allocated ("" = nothing more to say).
  virtual std::string memory_report() const = 0;
  // The device's peak GFLOP/s that MFU is measured against (fp8: the FP8 tensor cores'), 0 when
  // the trainer should measure the CPU's sgemm (the CPU, or a GPU it has no figure for).
  virtual double peak_gflops(bool fp8) const = 0;
  // The memory the data loader's ring is allocated from (pinned on a GPU).
  virtual Allocator loader_memory() const = 0;

  // The host fp32 parameters (state_size(), laid out as state_layout()): initialise or read a
  // checkpoint into them, then params_to_device(). params_to_host() returns them refreshed from
  // the training copy.
  virtual float* host_params() = 0;
  virtual void params_to_device() = 0;
  virtual float* params_to_host() = 0;
  // The update rule (optim.name) and the state it declares; that state as host buffers, one per
  // declared tensor (DistributedOptimizer::get_state / set_state; all zero: a fresh state).
  virtual std::string optim_rule() const = 0;
  virtual const std::vector<StateSpec>& optim_state() const = 0;
  virtual void get_optim_state(std::vector<std::vector<float>>& host) = 0;
  virtual void set_optim_state(const std::vector<std::vector<float>>& host) = 0;
  // The step before which the rule's state began: 0, or the step of a checkpoint whose state a
  // restart did not take (optim.reset_state); the rule counts its steps from there.
  virtual long optim_first_step() const = 0;
  virtual void set_optim_first_step(long step) = 0;

  struct StepResult {
    double loss;  // the executor's sum of this stage's micro-batch losses
    double norm;  // the global gradient norm before clipping
  };
  // Called on every rank once a step's gradients, norm and loss are known, before the optimizer
  // touches anything: false drops the update (the anomaly policy), leaving parameters and the
  // optimizer's state as they were. Gets StepResult's values.
  // fp8_amax: the largest of the step's FP8 amaxes (infinity where one is not finite), 0
  // without FP8 (model/fp8.hpp); a dropped update leaves the amax histories untouched too.
  using StepCheck = std::function<bool(double loss, double norm, double fp8_amax)>;
  // One optimizer step on this rank's micro-batches: gradients, the tied embedding's sum over
  // embed, the dp reduction, the norm, clipping (grad_clip > 0) and the update rule at learning
  // rate lr, step t, unless check (when given) says no.
  virtual StepResult train_step(const std::vector<HostMicroBatch>& batches, float dloss,
                                double grad_clip, double lr, long t,
                                const StepCheck& check = {}) = 0;
  // The sum of the mean losses of this rank's share of windows [first, first + count) of `file`
  // (file order), micro-batch by micro-batch: non-zero on the last stage.
  virtual double eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                               uint64_t count) = 0;
  // device.precision fp8: the delayed-scaling state of each of this rank's model chunks
  // (model/fp8.hpp), which checkpoints save and restore; empty otherwise.
  virtual std::vector<Fp8State*> fp8_states() = 0;
  // Where the FP8 GEMMs ran so far (cuBLASLt or tessera's kernel), "" where that is not a choice.
  virtual std::string fp8_report() const = 0;
  // What the engine has measured: train/telemetry.hpp takes differences around each step.
  struct Counters {
    TrafficBytes payload;  // handed to each group's communicators so far (parallel/traffic.hpp)
    // Seconds blocked in data-parallel collectives so far (dp, and ZeRO's shard and replica
    // groups): the communication no computation hid. 0 on a GPU, whose host does not wait.
    double dp_wait = 0;
    // Context parallelism so far: seconds blocked on the cp communicator (the ring's waits, the
    // all-gather's collectives) and seconds in its attention (those waits included).
    double cp_wait = 0, cp_attention = 0;
    // The pipeline's blocked and total seconds of the last train_step (PipelineExecutor).
    double pipeline_wait = 0, pipeline_run = 0;
    // Seconds blocked on the tensor-parallel, expert-parallel and tied-embedding communicators so
    // far, and in each kind of op (backend/op_clock.hpp; zeros where the clock is off).
    double tp_wait = 0, ep_wait = 0, embed_wait = 0;
    op_clock::Seconds ops{};
  };
  virtual Counters counters() const = 0;
  // The MoE layers' routing since the last call (model/moe_layer.hpp), summed over this rank's
  // chunks and micro-batches: [aux loss, z-loss, the bytes this rank sent in the expert-parallel
  // exchanges and the seconds it was blocked in them, then per model layer (of n_layer) the
  // busiest expert's tokens, the mean tokens per expert, the dropped choices]; zeros for dense
  // layers and layers of other stages. Clears them.
  virtual std::vector<double> take_moe_stats(int n_layer) = 0;
  // The MoE layers' kept activations, routing and dispatch buffers of every chunk (bytes).
  virtual size_t moe_buffer_bytes() const = 0;
  // model.moe.bias_rate: the MoE layers' selection biases (model/moe_layer.hpp) as the
  // layout-free table TrainState::moe_bias (a row of E per MoE layer, in layer order), this
  // rank's layers' rows filled, the others' the lowest float (a max over the ranks gathers the
  // table); and set from such a table (this rank's rows read; an empty one: zero).
  virtual std::vector<float> moe_bias() const = 0;
  virtual void set_moe_bias(const std::vector<float>& table) = 0;
};

// The backend an engine runs on and what its model reads: the CPU (fp32), or CUDA with fp32 or
// bf16 (bf16 parameters and activations, fp32 master weights).
enum class EngineKind { cpu, cuda_fp32, cuda_bf16 };
inline bool on_gpu(EngineKind k) { return k != EngineKind::cpu; }
inline bool bf16_activations(EngineKind k) { return k == EngineKind::cuda_bf16; }
// The deck's engine on a GPU (gpu) or the CPU: bf16 activations for device.precision bf16, and
// for fp8 on a GPU (bf16 around the FP8 GEMMs' inputs, model/fp8.hpp); the CPU simulates fp8 in
// fp32. The one place this is decided: the trainer and `tessera plan` both ask it.
EngineKind engine_kind(const Config& cfg, bool gpu);

// The engine of `kind` (CUDA needs a CUDA build and device::activate to have run). With
// Allocation::later every buffer is declared but none allocated until allocate(): the trainer
// checks host_bytes() against the machine first.
enum class Allocation { now, later };
std::unique_ptr<TrainEngine> make_engine(const EngineSetup& setup, EngineKind kind,
                                         Allocation allocation = Allocation::now);

}  // namespace tessera
