// The CUDA emulator's NCCL: the calls NcclComm makes (parallel/nccl_comm.cpp), on MPI over the
// emulator's host buffers. A call communicates when it is made, after the work its stream is
// ordered after has run (streams.hpp), so every rank meets its collectives in program order; its
// result lands in the receive buffer when the stream's queue gets there (at once with sync
// streams), so work that no event orders after it reads the old values in some drains.
//
// Bootstrap keeps NCCL's contract: one rank makes an ncclUniqueId, the caller broadcasts it, and
// every member calls ncclCommInitRank with it. The id carries its maker's world rank and a
// counter; the members tell the maker their world ranks over MPI_COMM_WORLD, it answers with the
// member list in NCCL rank order, and MPI_Comm_create_group (collective over the members only, as
// NCCL's init is) gives the communicator.
//
// Point to point: inside ncclGroupStart/End every send and receive is posted when the group ends
// and all complete together; alone, a send completes only when its receive is posted
// (MPI_Ssend), as an NCCL send holds its stream until the peer receives. So an order that would
// deadlock a GPU's streams deadlocks here too. bf16 sums add in fp32 and round, element by element.
// ncclCommDestroy waits for the peers (see there); ncclCommAbort does not.
//
// TESSERA_EMU_NCCL_ERROR=N (set for one rank) makes ncclCommGetAsyncError answer ncclRemoteError
// on every communicator once this process has queued N calls: a peer lost to a node or network
// fault as NCCL reports it, for the test that such a rank ends the job (parallel/nccl_comm.cpp).
// TESSERA_EMU_NCCL_HANG=N makes every stream of this process never finish once it has queued N
// calls (0: at once), with no error reported: a collective whose peer hangs, which only a bounded
// wait ends (device/stream_wait.hpp). Read at every query, so a test can set it for a while.
// TESSERA_EMU_NCCL_STUCK=group_end or finalize leaves that call of a nonblocking communicator
// (ncclCommInitRankConfig with blocking 0) in progress for ever: ncclGroupEnd or ncclCommFinalize
// returns ncclInProgress and ncclCommGetAsyncError answers ncclInProgress from then on, as a group
// of sends and receives connecting lazily to a lost peer, or a finalisation waiting for one,
// would. The nonblocking calls that finish return ncclSuccess at once (the emulator's
// initialisation is synchronous).
#include <mpi.h>
#include <nccl.h>

#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/emu/memory.hpp"
#include "device/emu/races.hpp"
#include "device/emu/streams.hpp"

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  bool blocking = true;      // ncclConfig_t's blocking (ncclCommInitRankConfig)
  bool in_progress = false;  // a nonblocking call that never finishes (TESSERA_EMU_NCCL_HANG)
  bool finalized = false;    // ncclCommFinalize met the peers: destroy frees alone
};

namespace tessera::emu {
namespace {

constexpr char kMagic[] = "tessera-emu-nccl";
constexpr int kTagBase = 30000;  // bootstrap messages on MPI_COMM_WORLD: tags 30000..30999

struct Id {
  char magic[sizeof kMagic];
  int world_rank;
  int counter;
};
static_assert(sizeof(Id) <= sizeof(ncclUniqueId));

struct Pending {
  bool send;
  void* buffer;
  int count;
  MPI_Datatype type;
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
  std::shared_ptr<std::vector<unsigned char>> staged;  // a receive's landing copy
};
int g_group_depth = 0;
std::vector<Pending> g_pending;
long g_calls = 0;  // calls queued by this process (every one passes check)

// TESSERA_EMU_NCCL_ERROR: the call count after which the asynchronous error shows; 0: never.
long error_after() {
  static const long after = [] {
    const char* v = std::getenv("TESSERA_EMU_NCCL_ERROR");
    if (!v) return 0L;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 1)
      fault(std::string("TESSERA_EMU_NCCL_ERROR=") + v + ": expected a call count of 1 or more");
    return n;
  }();
  return after;
}

// TESSERA_EMU_NCCL_STUCK names `call`.
bool stuck(const char* call) {
  const char* v = std::getenv("TESSERA_EMU_NCCL_STUCK");
  if (!v) return false;
  if (std::strcmp(v, "group_end") != 0 && std::strcmp(v, "finalize") != 0)
    fault(std::string("TESSERA_EMU_NCCL_STUCK=") + v + ": expected group_end or finalize");
  return std::strcmp(v, call) == 0;
}

}  // namespace

bool collective_hung() {
  const char* v = std::getenv("TESSERA_EMU_NCCL_HANG");
  if (!v) return false;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n < 0)
    fault(std::string("TESSERA_EMU_NCCL_HANG=") + v + ": expected a call count of 0 or more");
  return g_calls >= n;
}

namespace {

MPI_Datatype mpi_type(ncclDataType_t t, size_t* bytes) {
  switch (t) {
    case ncclFloat32: *bytes = 4; return MPI_FLOAT;
    case ncclFloat64: *bytes = 8; return MPI_DOUBLE;
    case ncclInt32: *bytes = 4; return MPI_INT32_T;
    case ncclBfloat16: *bytes = 2; return MPI_UINT16_T;
    case ncclUint8: *bytes = 1; return MPI_UINT8_T;
    default: *bytes = 0; return MPI_DATATYPE_NULL;
  }
}

void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*, bool max) {
  auto* a = static_cast<const __nv_bfloat16*>(in);
  auto* b = static_cast<__nv_bfloat16*>(inout);
  for (int i = 0; i < *len; i++) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    b[i] = __float2bfloat16_rn(max ? (x > y ? x : y) : x + y);
  }
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* t) { bf16_reduce(in, inout, len, t, false); }
void bf16_max(void* in, void* inout, int* len, MPI_Datatype* t) { bf16_reduce(in, inout, len, t, true); }

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
  if (t == ncclBfloat16) {
    static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;
    if (sum == MPI_OP_NULL) {
      MPI_Op_create(bf16_sum, 1, &sum);
      MPI_Op_create(bf16_max, 1, &max);
    }
    return op == ncclSum ? sum : op == ncclMax ? max : MPI_OP_NULL;
  }
  return op == ncclSum ? MPI_SUM : op == ncclMax ? MPI_MAX : MPI_OP_NULL;
}

// The checks every call makes: a live communicator, a supported type, device buffers.
ncclResult_t check(const char* call, ncclComm_t comm, ncclDataType_t t,
                   std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (!comm || comm->comm == MPI_COMM_NULL) return say(std::string(call) + ": no communicator"), ncclInvalidArgument;
  size_t bytes = 0;
  if (mpi_type(t, &bytes) == MPI_DATATYPE_NULL) return say(std::string(call) + ": unsupported type"), ncclInvalidArgument;
  for (const auto& [p, n] : buffers)
    if (const std::string why = check_device_range(p, n * bytes); n && !why.empty())
      return say(std::string(call) + ": a buffer of " + std::to_string(n * bytes) + " bytes: " + why), ncclInvalidArgument;
  g_calls++;
  return ncclSuccess;
}

// Where a call's result lands: it is computed now, into a staging copy (the ranks meet in their
// calls in program order), and lands in `dst` when the stream gets there (at once with sync
// streams): work that no event orders after the call reads the old values in some drains.
using Staged = std::shared_ptr<std::vector<unsigned char>>;
void land_later(cudaStream_t stream, void* dst, Staged staged) {
  enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
}
void land(cudaStream_t stream, void* dst, size_t bytes, const std::function<void(void*)>& fill) {
  auto staged = std::make_shared<std::vector<unsigned char>>(bytes);
  fill(staged->data());
  land_later(stream, dst, staged);
}

ncclResult_t collective_in_group(const char* call) {
  say(std::string(call) + " inside ncclGroupStart/End: the emulator groups only send and recv");
  return ncclInvalidUsage;
}

}  // namespace
}  // namespace tessera::emu

using namespace tessera::emu;

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  static int counter = 0;
  Id id{};
  std::memcpy(id.magic, kMagic, sizeof kMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &id.world_rank);
  id.counter = counter++;
  std::memset(unique_id, 0, sizeof *unique_id);
  std::memcpy(unique_id->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  const ncclResult_t r = ncclCommInitRank(comm, nranks, comm_id, rank);
  if (r == ncclSuccess && config && config->blocking == 0) (*comm)->blocking = false;
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  Id id;
  std::memcpy(&id, comm_id.internal, sizeof id);
  if (std::memcmp(id.magic, kMagic, sizeof kMagic) != 0 || nranks < 1 || rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int tag = kTagBase + id.counter % 1000;
  std::vector<int> members(size_t(nranks), -1);  // world rank of each NCCL rank
  if (me == id.world_rank) {
    members[size_t(rank)] = me;
    for (int i = 1; i < nranks; i++) {
      int msg[2];
      MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (msg[0] < 0 || msg[0] >= nranks || members[size_t(msg[0])] >= 0) return ncclInvalidUsage;
      members[size_t(msg[0])] = msg[1];
    }
    for (int i = 0; i < nranks; i++)
      if (members[size_t(i)] != me)
        MPI_Send(members.data(), nranks, MPI_INT, members[size_t(i)], tag, MPI_COMM_WORLD);
  } else {
    const int msg[2] = {rank, me};
    MPI_Send(msg, 2, MPI_INT, id.world_rank, tag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), nranks, MPI_INT, id.world_rank, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, members.data(), &group);
  auto* c = new ncclComm;
  MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  c->rank = rank;
  c->size = nranks;
  *comm = c;
  return ncclSuccess;
}

// NCCL's destroy finalizes first: it flushes the work still queued, which may need the peers.
// Here it waits for them outright (a barrier), the worst case, so that a rank that leaves on an
// error through ncclCommDestroy, while a peer is elsewhere, hangs here as it could on a GPU.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (!comm->blocking && stuck("finalize")) {
    comm->in_progress = true;
    return ncclInProgress;
  }
  if (comm->comm != MPI_COMM_NULL) MPI_Barrier(comm->comm);
  comm->finalized = true;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->comm != MPI_COMM_NULL) {
    if (!comm->finalized) MPI_Barrier(comm->comm);
    MPI_Comm_free(&comm->comm);
  }
  delete comm;
  return ncclSuccess;
}

// Without MPI_Comm_free, which is collective: the peers may never come.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm) return ncclInvalidArgument;
  *async_error = error_after() > 0 && g_calls >= error_after() ? ncclRemoteError
                 : comm->in_progress                          ? ncclInProgress
                                                               : ncclSuccess;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  flush(stream);  // what the stream queued before the call, and what that waits for
  if (g_group_depth) return collective_in_group("ncclAllReduce");
  if (ncclResult_t e = check("ncclAllReduce", comm, datatype, {{sendbuff, count}, {recvbuff, count}}); e)
    return e;
  size_t bytes;
  const MPI_Datatype t = mpi_type(datatype, &bytes);
  const MPI_Op o = mpi_op(op, datatype);
  if (o == MPI_OP_NULL) return ncclInvalidArgument;
  touch(stream, "ncclAllReduce", {{sendbuff, count * bytes, false}, {recvbuff, count * bytes, true}});
  land(stream, recvbuff, count * bytes, [&](void* out) {
    MPI_Allreduce(sendbuff, out, int(count), t, o, comm->comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  flush(stream);  // what the stream queued before the call, and what that waits for
  if (g_group_depth) return collective_in_group("ncclReduceScatter");
  if (ncclResult_t e = check("ncclReduceScatter", comm, datatype,
                             {{sendbuff, recvcount * size_t(comm ? comm->size : 1)}, {recvbuff, recvcount}});
      e)
    return e;
  size_t bytes;
  const MPI_Datatype t = mpi_type(datatype, &bytes);
  const MPI_Op o = mpi_op(op, datatype);
  if (o == MPI_OP_NULL) return ncclInvalidArgument;
  touch(stream, "ncclReduceScatter", {{sendbuff, recvcount * bytes * size_t(comm->size), false},
                                      {recvbuff, recvcount * bytes, true}});
  // Into the staging copy: NCCL's in-place form (recv inside send) is not MPI's.
  land(stream, recvbuff, recvcount * bytes, [&](void* out) {
    MPI_Reduce_scatter_block(sendbuff, out, int(recvcount), t, o, comm->comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  flush(stream);  // what the stream queued before the call, and what that waits for
  if (g_group_depth) return collective_in_group("ncclAllGather");
  if (ncclResult_t e = check("ncclAllGather", comm, datatype,
                             {{sendbuff, sendcount}, {recvbuff, sendcount * size_t(comm ? comm->size : 1)}});
      e)
    return e;
  size_t bytes;
  const MPI_Datatype t = mpi_type(datatype, &bytes);
  touch(stream, "ncclAllGather", {{sendbuff, sendcount * bytes, false},
                                  {recvbuff, size_t(comm->size) * sendcount * bytes, true}});
  land(stream, recvbuff, size_t(comm->size) * sendcount * bytes, [&](void* out) {
    MPI_Allgather(sendbuff, int(sendcount), t, out, int(sendcount), t, comm->comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  flush(stream);  // what the stream queued before the call, and what that waits for
  if (ncclResult_t e = check("ncclSend", comm, datatype, {{sendbuff, count}}); e) return e;
  if (peer < 0 || peer >= comm->size) return ncclInvalidArgument;
  size_t bytes;
  const MPI_Datatype t = mpi_type(datatype, &bytes);
  touch(stream, "ncclSend", {{sendbuff, count * bytes, false}});
  if (g_group_depth) {
    g_pending.push_back({true, const_cast<void*>(sendbuff), int(count), t, peer, comm, stream,
                         nullptr});
    return ncclSuccess;
  }
  MPI_Ssend(sendbuff, int(count), t, peer, 0, comm->comm);
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  flush(stream);  // what the stream queued before the call, and what that waits for
  if (ncclResult_t e = check("ncclRecv", comm, datatype, {{recvbuff, count}}); e) return e;
  if (peer < 0 || peer >= comm->size) return ncclInvalidArgument;
  size_t bytes;
  const MPI_Datatype t = mpi_type(datatype, &bytes);
  touch(stream, "ncclRecv", {{recvbuff, count * bytes, true}});
  if (g_group_depth) {
    g_pending.push_back({false, recvbuff, int(count), t, peer, comm, stream,
                         std::make_shared<std::vector<unsigned char>>(count * bytes)});
    return ncclSuccess;
  }
  land(stream, recvbuff, count * bytes, [&](void* out) {
    MPI_Recv(out, int(count), t, peer, 0, comm->comm, MPI_STATUS_IGNORE);
  });
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0) return ncclSuccess;
  // A nonblocking group whose peer never connects: in progress for ever (TESSERA_EMU_NCCL_STUCK).
  if (!g_pending.empty() && !g_pending.front().comm->blocking && stuck("group_end")) {
    for (const Pending& p : g_pending) p.comm->in_progress = true;
    g_pending.clear();
    return ncclInProgress;
  }
  std::vector<MPI_Request> requests(g_pending.size());
  for (size_t i = 0; i < g_pending.size(); i++) {
    const Pending& p = g_pending[i];
    if (p.send)
      MPI_Isend(p.buffer, p.count, p.type, p.peer, 0, p.comm->comm, &requests[i]);
    else
      MPI_Irecv(p.staged->data(), p.count, p.type, p.peer, 0, p.comm->comm, &requests[i]);
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  for (const Pending& p : g_pending)  // each receive lands when its stream gets there
    if (!p.send) land_later(p.stream, p.buffer, p.staged);
  g_pending.clear();
  return ncclSuccess;
}

}  // extern "C"
