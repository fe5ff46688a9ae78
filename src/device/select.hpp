#pragma once
// Which backend a run uses and, on CUDA, which GPU each rank takes. Decided once at start, before
// any data or model memory is allocated, and in every build (a CPU-only build still answers
// `device.backend: cuda` with a message).
#include <mpi.h>

#include <string>

#include "config/config.hpp"

namespace tessera::device {

// The ranks of this rank's node: MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED). Collective
// over `world`; the caller frees it.
MPI_Comm node_comm(MPI_Comm world);

// The rank's index among the ranks of its node: the MPI launcher's own variable (MPI_LOCALRANKID
// of MPICH's hydra, OMPI_COMM_WORLD_LOCAL_RANK of Open MPI, PALS_LOCAL_RANKID of Cray PALS,
// PMI_LOCAL_RANK of Cray PMI, first found), else the rank in `node`. SLURM_LOCALID is never
// read: under mpiexec inside an sbatch allocation every rank inherits the batch step's 0, and
// under srun the node communicator numbers the ranks just as well. `source` receives where the
// number came from, for the log.
int node_local_rank(MPI_Comm node, std::string* source = nullptr);

// The GPU a rank with node-local rank `local_rank` takes among `visible` devices: 0 when exactly
// one is visible (the site bound one GPU per rank), else local_rank, which must be < visible.
// Returns -1 when it is not (more ranks on the node than GPUs).
int pick_device(int local_rank, int visible);

// The bound of a GPU run's host waits when run.hang_timeout is 0 (docs/gpu.md, "A lost peer or
// a hung collective"): 15 minutes, far above a step's device work (every step ends in a stream
// wait, so one wait covers at most one step) and NCCL's first connections; checkpoint writes are
// collective host work, never inside a wait on the GPU.
constexpr double kDefaultWaitLimit = 900;

struct DeviceChoice {
  bool cuda = false;    // false: the CPU backend
  int device = -1;      // the CUDA device ordinal this rank uses (cuda only)
  std::string note;     // one line for rank 0's start-up log ("" = nothing to say)
  // The longest host wait on the GPU (device/stream_wait): run.hang_timeout, else
  // kDefaultWaitLimit.
  double wait_limit = 0;
  // device.expert_gemm == grouped (cuda only): the routed experts' GEMMs one grouped cuBLAS call
  // per product (backend/cuda/matmul.cu).
  bool grouped_experts = false;
};

// Applies device.backend and device.precision to what this build and this machine have:
//   cpu  -> the CPU;
//   cuda -> a GPU, or UserError (exit 2) naming why not: a CPU-only build, no visible GPU
//           (cudaGetDeviceCount failed or found 0), more ranks on a node than GPUs, two ranks
//           of a node on the same GPU (their device UUIDs compared over the node);
//   auto -> a GPU when the CUDA path can train, else the CPU, and `note` says which and why.
// Collective over `world`: every rank learns whether every other rank found a GPU of its own.
// The note lists each rank's GPU (up to 16 ranks).
DeviceChoice choose_backend(const Config& cfg, MPI_Comm world);

// On a CUDA choice: cudaSetDevice(choice.device) and the backend's stream and cuBLAS handle
// (device::init, device/context.hpp), before any device memory or NCCL communicator is made. A no-op for the CPU.
void activate(const DeviceChoice& choice);

}  // namespace tessera::device
