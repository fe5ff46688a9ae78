#include "parallel/nccl_comm.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "device/check.hpp"
#include "device/context.hpp"
#include "device/stream_wait.hpp"
#ifdef TESSERA_CUDA_EMU
#include "device/emu/races.hpp"
#endif
#include "parallel/comm.hpp"

namespace tessera {

namespace {

template <typename T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, uint8_t>) return ncclUint8;
  else static_assert(sizeof(T) == 0, "no NCCL type for T");
}

// The communicator's MPI name (the mesh's group names: tp, dpcp, pp, embed...), for the hang forensics' ring
// (parallel/comm.hpp). On a GPU the ring holds the calls as they were queued on the stream.
std::string name_of(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = "none";
  int length = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_get_name(comm, name, &length);
  return name;
}

// The communicators check_async_errors polls: those with NCCL resources, alive.
std::vector<NcclComm*>& live() {
  static std::vector<NcclComm*> comms;
  return comms;
}

}  // namespace

NcclComm::NcclComm(MPI_Comm comm, bool overlap)
    : mpi_(comm), compute_(device::stream()), stream_(device::stream()) {
  if (comm == MPI_COMM_NULL) return;
  MPI_Comm_size(comm, &size_);
  MPI_Comm_rank(comm, &rank_);
  if (size_ <= 1) return;  // nothing to communicate: no NCCL resources either
  ncclUniqueId id;
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, comm);
  // Nonblocking (NCCL >= 2.14): the calls that wait for the peers inside NCCL (the
  // initialisation, a group of sends and receives connecting lazily, the finalisation) return
  // ncclInProgress and are polled under the device's wait bound (issue, await) instead of
  // blocking this thread for ever when a peer is lost.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  last_call_ = "nccl init";
  issue(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
  live().push_back(this);  // once it is whole: a constructor that throws leaves nothing behind
  device::set_wait_check(&NcclComm::check_async_errors);
  if (overlap) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
#ifdef TESSERA_CUDA_EMU
    emu::name_stream(stream_, "overlapped collectives");
#endif
    CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&communicated_, cudaEventDisableTiming));
  }
}

NcclComm::~NcclComm() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (computed_) cudaEventDestroy(computed_);
  if (communicated_) cudaEventDestroy(communicated_);
  if (stream_ != compute_) cudaStreamDestroy(stream_);
  std::erase(live(), this);
  if (!comm_) return;
  // No check: a destructor must not throw. On the way out of an error this rank's peers may be
  // waiting in a collective it will never join: ncclCommDestroy would wait with them (for the
  // queued work), ncclCommAbort ends the communicator's kernels at once, so the error reaches
  // main and its one line and MPI_Abort end the job.
  if (std::uncaught_exceptions() > 0) {
    ncclCommAbort(comm_);
    return;
  }
  // Finalising flushes the queued work, which may wait for the peers: polled, and past the bound
  // the rank says so and ends the job (a destructor cannot throw to main).
  try {
    last_call_ = "nccl finalize";
    issue(ncclCommFinalize(comm_), "ncclCommFinalize");
  } catch (const UserError& e) {
    if (comm_) ncclCommAbort(comm_);
    abort_with_line(e.what(), e.exit_code);  // its pause lets the launcher forward the line
  }
  ncclCommDestroy(comm_);
}

void NcclComm::issue(ncclResult_t result, const char* call) {
  if (result == ncclInProgress) {
    const std::string what = std::string(call) + " on NCCL communicator " + name_of(mpi_) + " (" +
                             std::to_string(size_) + " ranks)";
    device::wait_until(
        [this] {
          ncclResult_t state = ncclSuccess;
          NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
          if (state == ncclInProgress) return false;
          if (state != ncclSuccess) fail_on(state, last_call_);
          return true;
        },
        what.c_str());
    return;
  }
  if (result != ncclSuccess) fail_on(result, last_call_);
}

void NcclComm::fail_on(ncclResult_t error, const char* call) {
  // The peers may be gone: abort (destroy would wait for them), then end this rank.
  ncclCommAbort(comm_);
  comm_ = nullptr;
  const std::string what = "NCCL communicator " + name_of(mpi_) + " (" + std::to_string(size_) +
                           " ranks, last call " + call + ")";
  device::fail(what.c_str(), ncclGetErrorString(error), __FILE__, __LINE__);
}

void NcclComm::check_async_errors() {
  for (NcclComm* c : live()) {
    ncclResult_t error = ncclSuccess;
    if (!c->comm_ || ncclCommGetAsyncError(c->comm_, &error) != ncclSuccess) continue;
    if (error == ncclSuccess || error == ncclInProgress) continue;
    c->fail_on(error, c->last_call_);
  }
}

void NcclComm::enter() {
  if (stream_ == compute_) return;
  CUDA_CHECK(cudaEventRecord(computed_, compute_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, computed_, 0));
}

void NcclComm::leave() {
  if (stream_ == compute_) return;
  CUDA_CHECK(cudaEventRecord(communicated_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(compute_, communicated_, 0));
}

template <typename T>
void NcclComm::all_reduce_sum(T* x, size_t n) {
  if (!active() || n == 0) return;
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl all_reduce_sum", n * sizeof(T));
  issue(ncclAllReduce(x, x, n, nccl_type<T>(), ncclSum, comm_, stream_), "ncclAllReduce");
  leave();
  payload_bytes += n * sizeof(T);
}

void NcclComm::start_all_reduce_sum(float* x, size_t n) {
  if (!active() || n == 0) return;
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl start_all_reduce_sum",
                          n * sizeof(float));
  issue(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  payload_bytes += n * sizeof(float);
}

void NcclComm::wait_reductions() {
  if (active()) leave();
}

void NcclComm::all_reduce_max(float* x, size_t n) {
  if (!active() || n == 0) return;
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl all_reduce_max",
                          n * sizeof(float));
  issue(ncclAllReduce(x, x, n, ncclFloat32, ncclMax, comm_, stream_), "ncclAllReduce");
  leave();
  payload_bytes += n * sizeof(float);
}

template <typename T>
void NcclComm::reduce_scatter_sum(const T* send, T* recv, size_t count) {
  if (count == 0) return;
  if (!active()) {  // one rank: its block is the whole buffer
    if (send != recv)
      CUDA_CHECK(cudaMemcpyAsync(recv, send, count * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl reduce_scatter_sum",
                          size_t(size_) * count * sizeof(T));
  issue(ncclReduceScatter(send, recv, count, nccl_type<T>(), ncclSum, comm_, stream_),
        "ncclReduceScatter");
  leave();
  payload_bytes += size_t(size_) * count * sizeof(T);
}

template <typename T>
void NcclComm::all_gather(const T* send, T* recv, size_t count) {
  if (count == 0) return;
  if (!active()) {
    if (send != recv)
      CUDA_CHECK(cudaMemcpyAsync(recv, send, count * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl all_gather",
                          size_t(size_) * count * sizeof(T));
  issue(ncclAllGather(send, recv, count, nccl_type<T>(), comm_, stream_), "ncclAllGather");
  leave();
  payload_bytes += size_t(size_) * count * sizeof(T);
}

int NcclComm::ticket() {
  size_t i = 0;
  while (i < taken_.size() && taken_[i]) ++i;
  if (i == taken_.size()) {
    events_.push_back(nullptr);
    taken_.push_back(false);
    CUDA_CHECK(cudaEventCreateWithFlags(&events_[i], cudaEventDisableTiming));
  }
  taken_[i] = true;
  CUDA_CHECK(cudaEventRecord(events_[i], stream_));
  return int(i);
}

template <typename T>
int NcclComm::start_all_gather(const T* send, T* recv, size_t count) {
  if (count == 0) return -1;
  if (!active() || stream_ == compute_) {
    all_gather(send, recv, count);
    return -1;
  }
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl start_all_gather",
                          size_t(size_) * count * sizeof(T));
  issue(ncclAllGather(send, recv, count, nccl_type<T>(), comm_, stream_), "ncclAllGather");
  payload_bytes += size_t(size_) * count * sizeof(T);
  return ticket();
}

template <typename T>
int NcclComm::start_reduce_scatter_sum(const T* send, T* recv, size_t count) {
  if (count == 0) return -1;
  if (!active() || stream_ == compute_) {
    reduce_scatter_sum(send, recv, count);
    return -1;
  }
  enter();
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl start_reduce_scatter_sum",
                          size_t(size_) * count * sizeof(T));
  issue(ncclReduceScatter(send, recv, count, nccl_type<T>(), ncclSum, comm_, stream_),
        "ncclReduceScatter");
  payload_bytes += size_t(size_) * count * sizeof(T);
  return ticket();
}

void NcclComm::wait(int t) {
  if (t < 0) return;
  CUDA_CHECK(cudaStreamWaitEvent(compute_, events_[size_t(t)], 0));
  taken_[size_t(t)] = false;
}

void NcclComm::group_start() {
  enter();
  NCCL_CHECK(ncclGroupStart());
}
void NcclComm::group_end() {
  last_call_ = "nccl group_end";
  issue(ncclGroupEnd(), "ncclGroupEnd");
  leave();
}

template <typename T>
void NcclComm::send(const T* x, size_t n, int peer, int) {
  if (n == 0) return;
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl send", n * sizeof(T), peer);
  issue(ncclSend(x, n, nccl_type<T>(), peer, comm_, stream_), "ncclSend");
  payload_bytes += n * sizeof(T);
}

template <typename T>
void NcclComm::recv(T* x, size_t n, int peer, int) {
  if (n == 0) return;
  const trace::Scope call(name_of(mpi_).c_str(), last_call_ = "nccl recv", n * sizeof(T), peer);
  issue(ncclRecv(x, n, nccl_type<T>(), peer, comm_, stream_), "ncclRecv");
}

void NcclComm::all_to_all_counts(const int* send, int* recv, int n) {
  if (!active()) {
    std::copy(send, send + n, recv);
    return;
  }
  MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, mpi_);
}

template <typename T>
void NcclComm::all_to_all_rows(const T* send, const int* send_rows, T* recv, const int* recv_rows,
                               size_t width) {
  group_start();
  size_t s_at = 0, r_at = 0;
  for (int r = 0; r < size_; ++r) {
    const size_t sn = size_t(send_rows[r]) * width, rn = size_t(recv_rows[r]) * width;
    if (r == rank_) {
      // NCCL sends to itself too; a device copy is the same and cheaper.
      if (sn > 0) CUDA_CHECK(cudaMemcpyAsync(recv + r_at, send + s_at, sn * sizeof(T),
                                             cudaMemcpyDeviceToDevice, stream_));
    } else {
      this->send(send + s_at, sn, r, 0);
      this->recv(recv + r_at, rn, r, 0);
    }
    s_at += sn, r_at += rn;
  }
  group_end();
}

#define TESSERA_INSTANTIATE(T)                                                                     \
  template void NcclComm::all_reduce_sum<T>(T*, size_t);                                          \
  template void NcclComm::reduce_scatter_sum<T>(const T*, T*, size_t);                            \
  template void NcclComm::all_gather<T>(const T*, T*, size_t);                                    \
  template int NcclComm::start_all_gather<T>(const T*, T*, size_t);                               \
  template int NcclComm::start_reduce_scatter_sum<T>(const T*, T*, size_t);                       \
  template void NcclComm::send<T>(const T*, size_t, int, int);                                    \
  template void NcclComm::recv<T>(T*, size_t, int, int);                                          \
  template void NcclComm::all_to_all_rows<T>(const T*, const int*, T*, const int*, size_t);
TESSERA_INSTANTIATE(float)
TESSERA_INSTANTIATE(double)
TESSERA_INSTANTIATE(__nv_bfloat16)
#undef TESSERA_INSTANTIATE
// ZeRO-3's FP8 weight codes (optim/sharded_weights.hpp).
template int NcclComm::start_all_gather<uint8_t>(const uint8_t*, uint8_t*, size_t);
template void NcclComm::all_gather<uint8_t>(const uint8_t*, uint8_t*, size_t);

}  // namespace tessera
