#pragma once
// What differs between the backends inside the trainer's one step loop (train/trainer.cpp): the
// model's forward and backward through the pipeline executor, the gradient reductions, the
// optimizer step, evaluation, and where the parameters and Adam moments live. The loop itself
// (stop requests, data loader, logging, evaluation and checkpoint cadence, metrics) is shared.
//
//   CpuEngine  (here)                    Gpt, PipelineExecutor, DistributedOptimizer over MPI,
//                                        parameters and gradients in host vectors
//   CudaEngine (train/engine_cuda.cpp)   GptCuda, PipelineExecutorCuda, DistributedOptimizerCuda
//                                        over NCCL, everything in one device arena (CUDA builds)
//
// Checkpoints stay fp32 and host-side on both: host_params() and get_moments() are full local
// fp32 buffers in the layout's offsets, so a run restarts on either backend.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/prefetch.hpp"
#include "io/token_source.hpp"
#include "model/gpt.hpp"
#include "model/shard.hpp"
#include "optim/adamw.hpp"
#include "optim/distributed.hpp"
#include "parallel/comm.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/schedule.hpp"

namespace tessera {

// What both engines are built from: the rank's tile, its communicators (MPI; the CUDA engine
// twins tp, dp, pp and embed over NCCL in that order), the stage's schedule and the step's shape.
struct EngineSetup {
  const LocalLayout& tile;
  Comm* tp;
  Comm* dp;
  Comm* pp;
  Comm* embed;
  Comm* world;
  std::vector<Action> schedule;
  int micro_batch, seq_len, n_micro;
  bool zero;       // parallel.zero == 1
  bool embed_sum;  // pp > 1: stage 0's wte and the last stage's copy sum their gradients
  AdamWHyper hyper;
};

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;

  // Elements of the parameter / gradient buffers (DistributedOptimizer::buffer_size).
  virtual size_t buffer_size() const = 0;
  virtual size_t moment_bytes() const = 0;
  virtual size_t activation_bytes() const = 0;
  // Lines for rank 0's start-up log: what the backend allocated ("" = nothing more to say).
  virtual std::string memory_report() const { return ""; }
  // The device's peak GFLOP/s that MFU is measured against, 0 when the trainer should measure
  // the CPU's sgemm (the CPU, or a GPU it has no figure for).
  virtual double peak_gflops() const { return 0.0; }
  // The memory the data loader's ring is allocated from (pinned on a GPU).
  virtual HostMemory loader_memory() const { return {}; }

  // The host fp32 parameters (buffer_size()): initialise or read a checkpoint into them, then
  // params_to_device(). params_to_host() returns them refreshed from the training copy.
  virtual float* host_params() = 0;
  virtual void params_to_device() {}
  virtual float* params_to_host() { return host_params(); }
  // Adam moments as full local host buffers (DistributedOptimizer::get_moments / set_moments).
  virtual void get_moments(std::vector<float>& m, std::vector<float>& v) = 0;
  virtual void set_moments(const std::vector<float>& m, const std::vector<float>& v) = 0;

  struct StepResult {
    double loss;  // the executor's sum of this stage's micro-batch losses
    double norm;  // the global gradient norm before clipping
  };
  // One optimizer step on this rank's micro-batches (host pointers; nullptr where the stage
  // reads no tokens): gradients, the tied embedding's sum over embed, the dp reduction, the
  // norm, clipping (grad_clip > 0) and AdamW at learning rate lr, step t.
  virtual StepResult train_step(const std::vector<MicroBatch>& batches, float dloss,
                                double grad_clip, double lr, long t) = 0;
  // evaluate_loss_sum of this rank's share of windows [first, first + count) of `file`.
  virtual double eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                               uint64_t count) = 0;
  // The pipeline's blocked and total seconds of the last train_step (PipelineExecutor).
  virtual double wait_seconds() const = 0;
  virtual double run_seconds() const = 0;
  // Payload bytes handed to communicator c (0 tp, 1 dp, 2 pp, 3 embed) so far.
  virtual double payload_bytes(int c) const = 0;
};

// The CPU backend: exactly the calls the trainer made before engines existed.
class CpuEngine final : public TrainEngine {
 public:
  explicit CpuEngine(const EngineSetup& setup);

  size_t buffer_size() const override { return optimizer_.buffer_size(); }
  size_t moment_bytes() const override { return optimizer_.moment_bytes(); }
  size_t activation_bytes() const override { return model_.activation_bytes(); }
  float* host_params() override { return params_.data(); }
  void get_moments(std::vector<float>& m, std::vector<float>& v) override {
    optimizer_.get_moments(m, v);
  }
  void set_moments(const std::vector<float>& m, const std::vector<float>& v) override {
    optimizer_.set_moments(m, v);
  }
  StepResult train_step(const std::vector<MicroBatch>& batches, float dloss, double grad_clip,
                        double lr, long t) override;
  double eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                       uint64_t count) override;
  double wait_seconds() const override { return executor_.wait_seconds(); }
  double run_seconds() const override { return executor_.run_seconds(); }
  double payload_bytes(int c) const override;

 private:
  const LocalLayout& tile_;
  Comm* comms_[4];  // tp, dp, pp, embed
  int mb_, T_;
  bool zero_, embed_sum_;
  DistributedOptimizer optimizer_;
  std::vector<float> params_, grads_;
  Gpt model_;
  PipelineExecutor executor_;
};

#ifdef TESSERA_CUDA
// The CUDA backend (train/engine_cuda.cpp): bf16 selects GptCuda<bf16> with fp32 master weights.
// device::activate must have run.
std::unique_ptr<TrainEngine> make_cuda_engine(const EngineSetup& setup, bool bf16);
#endif

}  // namespace tessera
