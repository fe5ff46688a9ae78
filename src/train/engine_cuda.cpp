// The trainer's CUDA backend (CUDA builds only): the twin of CpuEngine (train/engine.cpp), call
// for call, with GptCuda, PipelineExecutorCuda and DistributedOptimizerCuda on device buffers of
// one arena, and the tp, dp, pp and embed sums over NCCL communicators twinned with the MPI ones.
//
// Precision: fp32 master weights, gradients and Adam moments; F = bf16 adds a bf16 copy of the
// parameters that the model reads (refreshed by every optimizer step), F = float reads the
// master itself. Checkpoints and evaluation batches go through host memory, so checkpoints stay
// fp32 and a run restarts on either backend.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/context.hpp"
#include "backend/cuda/ops.hpp"
#include "device/arena.hpp"
#include "device/check.hpp"
#include "device/nccl_comm.hpp"
#include "device/pinned.hpp"
#include "model/gpt_cuda.hpp"
#include "optim/distributed_cuda.hpp"
#include "pipeline/executor_cuda.hpp"
#include "train/batch.hpp"
#include "train/engine.hpp"

namespace tessera {

namespace {

// The data loader's ring in page-locked memory, which the copy engine reads directly.
void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void pinned_release(void* p) { cudaFreeHost(p); }  // no check: runs in a destructor

template <typename F>
class CudaEngine final : public TrainEngine {
 public:
  explicit CudaEngine(const EngineSetup& s)
      : tile_(s.tile), comms_{s.tp, s.dp, s.pp, s.embed}, mb_(s.micro_batch), T_(s.seq_len),
        zero_(s.zero), embed_sum_(s.embed_sum),
        // NCCL communicators in the fixed order tp, dp, pp, embed (construction is collective).
        tp_(s.tp->get()), dp_(s.dp->get()), pp_(s.pp->get()), embed_(s.embed->get()),
        model_(s.tile, &tp_, s.micro_batch, s.seq_len, schedule_slots(s.schedule), arena_),
        optimizer_(s.tile, &dp_, s.world->get(), s.zero, s.hyper, arena_),
        executor_(model_, &pp_, s.schedule, s.micro_batch, s.seq_len, arena_) {
    const size_t n = optimizer_.buffer_size();
    const size_t tokens = size_t(s.n_micro) * s.micro_batch * s.seq_len;
    h_master_ = arena_.add("parameters (fp32 master)", n * sizeof(float));
    h_grads_ = arena_.add("gradients (fp32)", n * sizeof(float));
    if constexpr (std::is_same_v<F, cuda::bf16>)
      h_copy_ = arena_.add("parameters (bf16 copy)", n * sizeof(cuda::bf16));
    h_tokens_ = arena_.add("step input tokens", tokens * sizeof(int32_t));
    h_targets_ = arena_.add("step target tokens", tokens * sizeof(int32_t));
    arena_.allocate();
    model_.bind();
    optimizer_.bind();
    executor_.bind();
    master_ = arena_.get<float>(h_master_);
    grads_ = arena_.get<float>(h_grads_);
    if constexpr (std::is_same_v<F, cuda::bf16>) copy_ = arena_.get<cuda::bf16>(h_copy_);
    tokens_ = arena_.get<int32_t>(h_tokens_);
    targets_ = arena_.get<int32_t>(h_targets_);
    host_params_.assign(n, 0.0f);
  }

  size_t buffer_size() const override { return optimizer_.buffer_size(); }
  size_t moment_bytes() const override { return optimizer_.moment_bytes(); }
  size_t activation_bytes() const override { return model_.activation_bytes(); }
  std::string memory_report() const override {
    char backend[96];
    std::snprintf(backend, sizeof backend, "\n  cuBLAS workspace and reduction scratch: %.1f MB",
                  cuda::bytes_allocated() / 1e6);
    return std::string("device memory (rank 0, ") +
           (std::is_same_v<F, cuda::bf16> ? "bf16" : "fp32") + "):\n" + arena_.report() + backend;
  }
  HostMemory loader_memory() const override { return {pinned_allocate, pinned_release}; }
  // Dense datasheet peaks (no sparsity), as tests/gpu/bench.cpp: bf16 tensor cores; fp32
  // without TF32 (the fp32 path's GEMMs) the CUDA cores. A100: 312 / 19.5 TFLOP/s; H100 SXM and
  // H200: 989 / 67; H100 PCIe: 756 / 51.
  double peak_gflops() const override {
    int dev = 0;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    const bool bf16 = std::is_same_v<F, cuda::bf16>;
    const bool pcie = std::string(p.name).find("PCIe") != std::string::npos;
    if (p.major == 9) return pcie ? (bf16 ? 756e3 : 51e3) : (bf16 ? 989e3 : 67e3);
    if (p.major == 8 && p.minor == 0) return bf16 ? 312e3 : 19.5e3;
    return 0.0;
  }

  float* host_params() override { return host_params_.data(); }
  void params_to_device() override {
    const size_t n = host_params_.size();
    CUDA_CHECK(cudaMemcpyAsync(master_, host_params_.data(), n * sizeof(float),
                               cudaMemcpyHostToDevice, cuda::stream()));
    if constexpr (std::is_same_v<F, cuda::bf16>) {
      // Rounded to nearest even on the host, as adamw_update rounds its refreshed copy.
      std::vector<cuda::bf16> rounded(n);
      for (size_t i = 0; i < n; ++i) rounded[i] = __float2bfloat16(host_params_[i]);
      CUDA_CHECK(cudaMemcpyAsync(copy_, rounded.data(), n * sizeof(cuda::bf16),
                                 cudaMemcpyHostToDevice, cuda::stream()));
      CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));  // `rounded` is freed on return
    }
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  }
  float* params_to_host() override {
    CUDA_CHECK(cudaMemcpyAsync(host_params_.data(), master_, host_params_.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, cuda::stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    return host_params_.data();
  }
  void get_moments(std::vector<float>& m, std::vector<float>& v) override {
    optimizer_.get_moments(m, v);
  }
  void set_moments(const std::vector<float>& m, const std::vector<float>& v) override {
    optimizer_.set_moments(m, v);
  }

  // CpuEngine::train_step, line for line, after the inputs' copy to the device.
  StepResult train_step(const std::vector<MicroBatch>& batches, float dloss, double grad_clip,
                        double lr, long t) override {
    const cudaStream_t st = cuda::stream();
    const std::vector<MicroBatch> on_device = to_device(batches);
    CUDA_CHECK(cudaMemsetAsync(grads_, 0, optimizer_.buffer_size() * sizeof(float), st));
    // Each layer's gradient is summed over dp as soon as the step's last backward finishes it
    // (queued on the stream behind the kernels that produce it).
    auto layer_done = [&](int l) {
      const LocalTensor& a = tile_.tensors[size_t(tile_.layer(l, LayerTensor(0)))];
      const LocalTensor& b = tile_.tensors[size_t(tile_.layer(l, kFcProjB))];
      optimizer_.start_reduce(grads_, a.offset, b.offset + b.numel);
    };
    const double loss = executor_.run(model_params(), grads_, on_device, dloss,
                                      zero_ ? std::function<void(int)>{} : layer_done);
    // The tied embedding: stage 0's wte and the last stage's copy see the sum of both gradients.
    if (embed_sum_ && tile_.wte >= 0) {
      const LocalTensor& wte = tile_.tensors[size_t(tile_.wte)];
      embed_.all_reduce_sum(grads_ + wte.offset, wte.numel, st);
    }
    optimizer_.reduce_gradients(grads_);
    const double norm = optimizer_.grad_norm(grads_);
    optimizer_.step(master_, copy_, grads_, grad_clip > 0 ? clip_factor(norm, grad_clip) : 1.0,
                    lr, t);
    CUDA_CHECK(cudaStreamSynchronize(st));  // the step's time is the GPU's
    return {loss, norm};
  }

  // evaluate_loss_sum (train/evaluate.cpp) with each micro-batch copied to the device and
  // walked alone: the same forwards, losses summed in the same order.
  double eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                       uint64_t count) override {
    const size_t n = size_t(count / uint64_t(mb_));
    const size_t bytes = size_t(mb_) * T_ * sizeof(int32_t);
    Batch batch(mb_, T_);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      read_eval_batch(file, first + i * uint64_t(mb_), vocab, batch);
      // Synchronous from pageable memory and ordered on the stream after the last forward.
      CUDA_CHECK(cudaMemcpyAsync(tokens_, batch.inputs.data(), bytes, cudaMemcpyHostToDevice,
                                 cuda::stream()));
      CUDA_CHECK(cudaMemcpyAsync(targets_, batch.targets.data(), bytes, cudaMemcpyHostToDevice,
                                 cuda::stream()));
      CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));  // `batch` is refilled next
      sum += executor_.forward_only(model_params(), {MicroBatch{tokens_, targets_}});
    }
    CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    return sum;
  }

  double wait_seconds() const override { return executor_.wait_seconds(); }
  double run_seconds() const override { return executor_.run_seconds(); }
  double payload_bytes(int c) const override {
    const device::NcclComm* nccl[] = {&tp_, &dp_, &pp_, &embed_};
    return double(comms_[c]->payload_bytes) + double(nccl[c]->payload_bytes);
  }

 private:
  const F* model_params() const {
    if constexpr (std::is_same_v<F, cuda::bf16>) return copy_;
    else return master_;
  }

  // The step's micro-batches (host, pinned: the loader's ring) into the device token buffers on
  // the copy stream; the compute stream waits for them. Stages that read no tokens get nullptr.
  std::vector<MicroBatch> to_device(const std::vector<MicroBatch>& batches) {
    std::vector<MicroBatch> out(batches.size());
    if (batches.empty() || batches[0].tokens == nullptr) return out;
    const size_t n = size_t(mb_) * T_;
    for (size_t k = 0; k < batches.size(); ++k) {
      copy_stream_.to_device(tokens_ + k * n, batches[k].tokens, n * sizeof(int32_t));
      copy_stream_.to_device(targets_ + k * n, batches[k].targets, n * sizeof(int32_t));
      out[k] = {tokens_ + k * n, targets_ + k * n};
    }
    copy_stream_.wait_on(cuda::stream());
    return out;
  }

  const LocalLayout& tile_;
  Comm* comms_[4];  // tp, dp, pp, embed (MPI: their payload is added to NCCL's)
  int mb_, T_;
  bool zero_, embed_sum_;
  device::NcclComm tp_, dp_, pp_, embed_;
  device::DeviceArena arena_;
  GptCuda<F> model_;
  DistributedOptimizerCuda optimizer_;
  PipelineExecutorCuda<F> executor_;
  device::CopyStream copy_stream_;
  size_t h_master_ = 0, h_grads_ = 0, h_copy_ = 0, h_tokens_ = 0, h_targets_ = 0;
  float* master_ = nullptr;
  float* grads_ = nullptr;
  cuda::bf16* copy_ = nullptr;  // bf16 only
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  std::vector<float> host_params_;  // checkpoints and initialisation
};

}  // namespace

std::unique_ptr<TrainEngine> make_cuda_engine(const EngineSetup& setup, bool bf16) {
  if (bf16) return std::make_unique<CudaEngine<cuda::bf16>>(setup);
  return std::make_unique<CudaEngine<float>>(setup);
}

}  // namespace tessera
