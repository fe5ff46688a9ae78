#include "device/select.hpp"

#include <climits>
#include <cstdlib>
#include <string>

#include "common/error.hpp"

#ifdef TESSERA_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/context.hpp"
#include "device/check.hpp"
#endif

namespace tessera::device {

int node_local_rank(MPI_Comm world, std::string* source) {
  // Ordered as the launchers that set them: srun, Cray PALS, Cray PMI, MPICH hydra, Open MPI.
  for (const char* var : {"SLURM_LOCALID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID",
                          "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end != '\0' || r < 0 || r > INT_MAX) continue;  // a garbled value: try the next source
    if (source) *source = var;
    return int(r);
  }
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  if (source) *source = "MPI_Comm_split_type";
  return r;
}

int pick_device(int local_rank, int visible) {
  if (visible == 1) return 0;
  return local_rank >= 0 && local_rank < visible ? local_rank : -1;
}

#ifdef TESSERA_CUDA
namespace {

// Lowest rank whose `ok` is false, or -1 when every rank's is true.
int first_failing_rank(bool ok, int rank, MPI_Comm world) {
  int mine = ok ? INT_MAX : rank, lowest = INT_MAX;
  MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, world);
  return lowest == INT_MAX ? -1 : lowest;
}

}  // namespace
#endif

DeviceChoice choose_backend(const Config& cfg, MPI_Comm world) {
  const std::string& want = cfg.device.backend;
  const bool bf16 = cfg.device.precision == "bf16";
  DeviceChoice choice;
  if (want == "cpu") return choice;  // bf16 with cpu is refused by the deck check
  const std::string deck = cfg.deck_path.empty() ? "deck" : cfg.deck_path;
  int rank = 0;
  MPI_Comm_rank(world, &rank);

#ifndef TESSERA_CUDA
  (void)rank;
  if (want == "cuda")
    throw UserError(deck + ": device.backend = cuda, but this tessera was built without "
                    "the CUDA backend (no nvcc at build time); use device.backend: cpu");
  if (bf16)
    throw UserError(deck + ": device.precision = bf16 needs the CUDA backend, and this tessera "
                    "was built without it; use device.precision: fp32");
  choice.note = "device: auto: this tessera was built without the CUDA backend: training on the CPU";
  return choice;
#else
  // A machine without a driver or a GPU makes cudaGetDeviceCount fail (no driver, insufficient
  // driver) or return 0: both mean "no GPU here", and the reason goes into the message.
  int visible = 0;
  const cudaError_t err = cudaGetDeviceCount(&visible);
  std::string why;
  if (err != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    visible = 0;
    (void)cudaGetLastError();  // clear the sticky error so nothing later reports it again
  } else if (visible == 0) {
    why = "cudaGetDeviceCount found 0 devices";
  }
  std::string source;
  const int local = node_local_rank(world, &source);  // collective: every rank calls it
  const int dev = visible > 0 ? pick_device(local, visible) : -1;
  if (visible > 0 && dev < 0)
    why = "node-local rank " + std::to_string(local) + " (from " + source + ") but only " +
          std::to_string(visible) + " visible GPU" + (visible == 1 ? "" : "s");
  const int bad = first_failing_rank(dev >= 0, rank, world);
  if (bad < 0) {
    // Every rank has its GPU: the trainer runs its CUDA engine (train/engine_cuda.cpp). Compiled
    // and checked against the CPU in tests/gpu, but not yet run on a GPU by its authors.
    set_identity(rank, dev);
    choice.cuda = true;
    choice.device = dev;
    choice.note = "device: " + want + ": CUDA, " + (bf16 ? "bf16" : "fp32") + ", rank 0 on GPU " +
                  std::to_string(dev) + " of " + std::to_string(visible) +
                  " visible (node-local rank " + std::to_string(local) + " from " + source + ")";
    return choice;
  }
  // Rank 0 prints the message; it knows its own reason, and only the rank of another's.
  const std::string reason =
      bad == rank ? why : "rank " + std::to_string(bad) + " found no usable GPU";
  if (want == "cuda")
    throw UserError(deck + ": device.backend = cuda, but rank " + std::to_string(bad) +
                    " has no GPU: " + reason + "; use device.backend: cpu or auto");
  if (bf16)
    throw UserError(deck + ": device.precision = bf16 needs a GPU, but rank " +
                    std::to_string(bad) + " has none (" + reason + "); use device.precision: fp32");
  choice.note = "device: auto: no GPU on rank " + std::to_string(bad) + " (" + reason +
                "): training on the CPU";
  return choice;
#endif
}

void activate(const DeviceChoice& choice) {
  if (!choice.cuda) return;
#ifdef TESSERA_CUDA
  CUDA_CHECK(cudaSetDevice(choice.device));
  cuda::init();
#endif
}

}  // namespace tessera::device
