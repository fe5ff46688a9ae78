#include "device/select.hpp"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"

#ifdef TESSERA_CUDA
#include <cuda_runtime_api.h>

#include "device/check.hpp"
#include "device/context.hpp"
#include "device/stream_wait.hpp"
#endif

namespace tessera::device {

MPI_Comm node_comm(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  return node;
}

int node_local_rank(MPI_Comm node, std::string* source) {
  for (const char* var :
       {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end != '\0' || r < 0 || r > INT_MAX) continue;  // a garbled value: try the next source
    if (source) *source = var;
    return int(r);
  }
  int r = 0;
  MPI_Comm_rank(node, &r);
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

// `text` of rank `root` on every rank.
std::string broadcast(std::string text, int root, MPI_Comm world) {
  int n = int(text.size());
  MPI_Bcast(&n, 1, MPI_INT, root, world);
  text.resize(size_t(n));
  MPI_Bcast(text.data(), n, MPI_CHAR, root, world);
  return text;
}

// "GPU-6b0c0f3e-..." as nvidia-smi -L writes a device's UUID.
std::string uuid_text(const cudaUUID_t& u) {
  char b[48];
  const auto* x = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(b, sizeof b, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12],
                x[13], x[14], x[15]);
  return b;
}

// "" when this rank's GPU has FP8 tensor cores (compute capability 8.9 or later; 0.0 is the CUDA
// emulator's, which runs every path), else what the user reads: "rank 3's GPU 1 is NVIDIA A100,
// compute capability 8.0".
std::string fp8_unsupported(int device, int world_rank) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  const int cc = p.major * 10 + p.minor;
  if (cc == 0 || cc >= 89) return "";
  return "rank " + std::to_string(world_rank) + "'s GPU " + std::to_string(device) + " is " +
         p.name + ", compute capability " + std::to_string(p.major) + "." +
         std::to_string(p.minor);
}

// "" when no two ranks of this node share a GPU, else (on the rank with the higher node-local
// index of the first such pair) what the user reads: the two world ranks, the node, the GPU.
// Collective over `node`.
std::string shared_gpu(int device, int world_rank, MPI_Comm node) {
  struct Entry {
    char uuid[16];
    int world_rank, device;
  } mine{}, *all = nullptr;
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  std::memcpy(mine.uuid, p.uuid.bytes, sizeof mine.uuid);
  mine.world_rank = world_rank;
  mine.device = device;
  int n = 1, me = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_rank(node, &me);
  std::vector<Entry> entries(static_cast<size_t>(n));
  all = entries.data();
  MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all, int(sizeof mine), MPI_BYTE, node);
  for (int j = 0; j < me; j++) {
    if (std::memcmp(all[j].uuid, mine.uuid, sizeof mine.uuid) != 0) continue;
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    return "ranks " + std::to_string(all[j].world_rank) + " and " + std::to_string(world_rank) +
           " on " + host + " would share one GPU (" + uuid_text(p.uuid) + ", their device " +
           std::to_string(all[j].device) + " and " + std::to_string(device) +
           "): each rank needs a GPU of its own (one rank per GPU; check CUDA_VISIBLE_DEVICES "
           "and the launcher's GPU binding)";
  }
  return "";
}

// "0->0 1->1 2->0 3->1" for the first 16 ranks: which GPU each rank took. Collective.
std::string devices_by_rank(int device, MPI_Comm world) {
  int size = 1;
  MPI_Comm_size(world, &size);
  std::vector<int> all(static_cast<size_t>(size));
  MPI_Allgather(&device, 1, MPI_INT, all.data(), 1, MPI_INT, world);
  std::string out;
  char item[32];
  for (int r = 0; r < size && r < 16; r++) {
    std::snprintf(item, sizeof item, "%s%d->%d", r ? " " : "", r, all[size_t(r)]);
    out += item;
  }
  if (size > 16) out += " (and " + std::to_string(size - 16) + " more ranks)";
  return out;
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

}  // namespace
#endif

DeviceChoice choose_backend(const Config& cfg, MPI_Comm world) {
  const DeviceBackend want = cfg.device.backend;
  const bool bf16 = cfg.device.precision == Precision::Bf16;
  DeviceChoice choice;
  choice.wait_limit = cfg.run.hang_timeout > 0 ? cfg.run.hang_timeout : kDefaultWaitLimit;
  if (want == DeviceBackend::Cpu) return choice;  // bf16 with cpu is refused by the deck check
  const std::string deck = cfg.deck_path.empty() ? "deck" : cfg.deck_path;
  int rank = 0;
  MPI_Comm_rank(world, &rank);

#ifndef TESSERA_CUDA
  (void)rank;
  if (want == DeviceBackend::Cuda)
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
  MPI_Comm node = node_comm(world);  // collective: every rank calls it
  const int local = node_local_rank(node, &source);
  const int dev = visible > 0 ? pick_device(local, visible) : -1;
  if (visible > 0 && dev < 0)
    why = "node-local rank " + std::to_string(local) + " (from " + source + ") but only " +
          std::to_string(visible) + " visible GPU" + (visible == 1 ? "" : "s");
  int bad = first_failing_rank(dev >= 0, rank, world);
  bool sharing = false;
  if (bad < 0) {
    // Two ranks on one GPU would fail later inside NCCL ("duplicate GPU") or crawl: say so now.
    const std::string shared = shared_gpu(dev, rank, node);
    bad = first_failing_rank(shared.empty(), rank, world);
    sharing = bad >= 0;
    if (sharing) why = broadcast(shared, bad, world);
  }
  MPI_Comm_free(&node);
  if (bad < 0 && cfg.device.precision == Precision::Fp8) {
    const std::string old = fp8_unsupported(dev, rank);
    bad = first_failing_rank(old.empty(), rank, world);
    if (bad >= 0)
      throw UserError(deck + ": device.precision = fp8 needs FP8 tensor cores (compute capability "
                      "8.9 or later: Ada, Hopper, Blackwell), but " + broadcast(old, bad, world) +
                      "; use device.precision: bf16");
  }
  if (bad < 0) {
    // Every rank has a GPU of its own: the trainer runs Engine<CudaBackend>.
    set_identity(rank, dev);
    choice.cuda = true;
    choice.device = dev;
    choice.grouped_experts = cfg.device.expert_gemm == ExpertGemm::Grouped;
    const std::string experts =
        cfg.model.moe.experts == 0 ? ""
        : choice.grouped_experts   ? "; experts' GEMMs grouped (cublasGemmGroupedBatchedEx)"
                                   : "; experts' GEMMs one per expert";
    const Precision precision = cfg.device.precision;
    choice.note = std::string("device: ") + deck_word(want) + ": CUDA, " +
                  (precision == Precision::Fp8 ? std::string("fp8 GEMMs, bf16 activations")
                                               : deck_word(precision)) +
                  ", GPU by rank: " + devices_by_rank(dev, world) + " (node-local rank from " +
                  source + "; rank 0 sees " + std::to_string(visible) + " GPU" +
                  (visible == 1 ? "" : "s") + "; host waits on the GPU end after " +
                  seconds(choice.wait_limit) + " s)" + experts;
    return choice;
  }
  // Rank 0 prints the message; it knows its own reason, and only the rank of another's (a
  // shared GPU's reason was broadcast: every rank has it).
  const std::string problem =
      sharing ? why
              : "rank " + std::to_string(bad) + " has no GPU: " +
                    (bad == rank ? why : "it found none it could use");
  if (want == DeviceBackend::Cuda)
    throw UserError(deck + ": device.backend = cuda, but " + problem +
                    "; use device.backend: cpu or auto");
  if (bf16)
    throw UserError(deck + ": device.precision = bf16 needs a GPU on every rank, but " + problem +
                    "; use device.precision: fp32");
  choice.note = "device: auto: " + problem + ": training on the CPU";
  return choice;
#endif
}

void activate(const DeviceChoice& choice) {
  if (!choice.cuda) return;
#ifdef TESSERA_CUDA
  CUDA_CHECK(cudaSetDevice(choice.device));
  init();
  set_wait_limit(choice.wait_limit);
  set_grouped_experts(choice.grouped_experts);
#endif
}

}  // namespace tessera::device
