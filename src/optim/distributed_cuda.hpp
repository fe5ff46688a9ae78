#pragma once
// The GPU twin of optim/distributed.hpp (CUDA builds only): the same optimizer step of one rank's
// tile, with the gradients and Adam state in device memory and the data-parallel sums over NCCL
// on the backend's stream. MPI stays for the one double of the global norm (the clip factor is
// decided on the host, as on the CPU).
//
// Precision: the master weights, gradients and moments are fp32. In bf16 mode the model reads a
// bf16 copy of the parameters, which step() refreshes from the updated master (`copy`); in fp32
// mode the model reads the master itself (copy = nullptr).
#include <mpi.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/cuda/ops.hpp"
#include "device/arena.hpp"
#include "device/nccl_comm.hpp"
#include "model/shard.hpp"
#include "optim/adamw.hpp"

namespace tessera {

class DistributedOptimizerCuda {
 public:
  // dp: this rank's data-parallel group over NCCL; world: every rank (the norm's MPI_Allreduce),
  // MPI_COMM_NULL for one rank. Declares its buffers (moments, the ZeRO-1 gradient shard) in
  // `arena`; bind() after the arena is allocated.
  DistributedOptimizerCuda(const LocalLayout& layout, device::NcclComm* dp, MPI_Comm world,
                           bool zero, const AdamWHyper& hyper, device::DeviceArena& arena);
  void bind();  // takes the pointers and zeroes the moments

  size_t buffer_size() const { return padded_; }

  // As DistributedOptimizer: start summing grads[begin, end) over dp (queued on the stream
  // behind the backward kernels that produced them), then the rest and the wait.
  void start_reduce(float* grads, size_t begin, size_t end);
  void reduce_gradients(float* grads);
  double grad_norm(const float* grads) const;
  // Scales the gradients, AdamW on the master (refreshing `copy` when given); under ZeRO-1 the
  // updated shards of the master (and copy) are all-gathered over dp.
  void step(float* master, cuda::bf16* copy, float* grads, double clip, double lr, long t);

  // Adam moments as full local host buffers (checkpoints), gathered over dp under ZeRO-1.
  void get_moments(std::vector<float>& m, std::vector<float>& v);
  void set_moments(const std::vector<float>& m, const std::vector<float>& v);
  size_t moment_bytes() const { return 2 * (shard_end_ - shard_begin_) * sizeof(float); }

 private:
  template <typename Fn>
  void for_each_piece(size_t lo, size_t hi, Fn f) const;
  const float* reduced(const float* grads) const { return zero_ ? grad_shard_ : grads; }

  const LocalLayout& layout_;
  device::NcclComm* dp_;
  MPI_Comm world_;
  bool zero_;
  AdamWHyper hyper_;
  size_t padded_, shard_begin_, shard_end_;
  size_t h_m_ = 0, h_v_ = 0, h_shard_ = 0;
  device::DeviceArena* arena_;
  float *m_ = nullptr, *v_ = nullptr, *grad_shard_ = nullptr;
  std::vector<std::pair<size_t, size_t>> started_;  // ranges already queued this step
};

}  // namespace tessera
