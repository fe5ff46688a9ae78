// The step breakdown on a GPU (backend/op_clock.hpp): each timed op between two events on the
// rank's stream, the time between them read once a step (collect waits for the last one).
// Events come from a pool that grows to the most ops of a step and is reused after each collect.
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/op_clock.hpp"

namespace tessera::cuda {

namespace {

class EventRecorder final : public op_clock::Recorder {
 public:
  ~EventRecorder() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  void begin(int slot) override {
    ops_.push_back({slot, take(), nullptr});
    CUDA_CHECK(cudaEventRecord(ops_.back().begin, stream()));
  }
  void end() override {
    ops_.back().end = take();
    CUDA_CHECK(cudaEventRecord(ops_.back().end, stream()));
  }
  void collect(op_clock::Seconds& seconds) override {
    if (ops_.empty()) return;
    CUDA_CHECK(cudaEventSynchronize(ops_.back().end));
    for (const Op& op : ops_) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, op.begin, op.end));
      seconds[size_t(op.slot)] += 1e-3 * double(ms);
    }
    ops_.clear();
    used_ = 0;
  }

 private:
  struct Op {
    int slot;
    cudaEvent_t begin, end;
  };
  cudaEvent_t take() {
    if (used_ == pool_.size()) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreate(&e));  // with timing
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<Op> ops_;
};

}  // namespace

void op_events(bool on) {
  static EventRecorder* recorder = nullptr;
  if (on && recorder == nullptr) recorder = new EventRecorder;  // lives as long as the process
  op_clock::use(on ? recorder : nullptr);
}

}  // namespace tessera::cuda
