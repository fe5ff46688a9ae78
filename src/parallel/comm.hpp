#pragma once
// Named communication over one MPI communicator: the CPU backend's transport, and the host-side
// collectives of every backend (the gradient norm, checkpoints). Call sites read
// `tp.all_reduce_sum(partial, n)`, so every communication is visible where it happens. A
// communicator of one rank (or none) makes every call a no-op, so one code path serves every
// layout. NcclComm offers the same calls on a GPU. Bytes are counted for `make bench`.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// Hang forensics (docs/checkpoints.md, "Long runs"): every call a Comm makes is recorded in this rank's ring
// of its last kTraceCalls calls (communicator, operation, bytes, peer, step, micro-batch, start
// and end), here in one place rather than at the call sites. A watchdog thread reads it.
namespace trace {
inline constexpr int kTraceCalls = 64;
void set_step(long step);    // the optimizer step being taken (the trainer)
void set_micro(int micro);   // the micro-batch the pipeline works on (the executor)
void set_phase(const char* phase);  // what the rank does between calls (a static string)
// Changes whenever a call starts or ends or the step or phase changes.
uint64_t progress();
// True while the rank is inside a recorded call; `what` then says which ("dp all_reduce 4096 B").
bool in_call(std::string* what);
// The ring, oldest first, one call a line, after the rank's step, micro-batch and phase.
std::string report(double now);
double now();  // the steady clock the records use, in seconds
// Records one call from construction to destruction.
class Scope {
 public:
  Scope(const char* comm, const char* op, size_t bytes, int peer = -1);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int slot_;
};
}  // namespace trace

class Comm {
 public:
  Comm() = default;
  // overlap is NcclComm's (a stream of its own): MPI's non-blocking sums overlap the compute
  // without one, so it changes nothing here.
  explicit Comm(MPI_Comm comm, bool overlap = false);
  // The size and rank of a communicator that is not there: what declarations read (`tessera
  // plan` counting a rank's buffers without MPI ranks). It must not communicate.
  static Comm shape(int size, int rank) {
    Comm c;
    c.size_ = size;
    c.rank_ = rank;
    return c;
  }
  MPI_Comm mpi() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool active() const { return size_ > 1; }

  // In place: x (n) = Σ (or max) over the ranks of x.
  void all_reduce_sum(float* x, size_t n) { reduce(x, n, MPI_FLOAT, MPI_SUM, sizeof(float)); }
  void all_reduce_sum(double* x, size_t n) { reduce(x, n, MPI_DOUBLE, MPI_SUM, sizeof(double)); }
  void all_reduce_max(float* x, size_t n) { reduce(x, n, MPI_FLOAT, MPI_MAX, sizeof(float)); }
  void all_reduce_max(int* x, size_t n) { reduce(x, n, MPI_INT, MPI_MAX, sizeof(int)); }
  // As all_reduce_sum, started now in 16 MB buckets and complete after wait_reductions(): the
  // data-parallel sum of a layer's gradients while the backward pass goes on below it.
  void start_all_reduce_sum(float* x, size_t n);
  void wait_reductions();
  // send (size * count) summed over the ranks; this rank keeps block `rank` in recv (count).
  void reduce_scatter_sum(const float* send, float* recv, size_t count);
  // The same in place: x (size * count) summed, this rank's block of the sums left in x and
  // returned (MPI leaves it at x, NCCL at x + rank * count).
  float* reduce_scatter_sum_in_place(float* x, size_t count);
  // recv (size * count) = every rank's send (count), in rank order; in place when send is
  // recv + rank * count.
  void all_gather(const float* send, float* recv, size_t count);
  // The same two started now and complete once wait(ticket) returns: recv written, send free to
  // reuse. A ticket is the call's; -1 is that of a call complete at once (one rank). progress()
  // lets MPI move started calls on between computations (MPICH progresses only inside MPI calls).
  int start_all_gather(const float* send, float* recv, size_t count);
  // ZeRO-3's FP8 weight codes (optim/sharded_weights.hpp): bytes.
  int start_all_gather(const uint8_t* send, uint8_t* recv, size_t count);
  int start_reduce_scatter_sum(const float* send, float* recv, size_t count);
  void wait(int ticket);
  void progress();

  // Expert parallelism's exchange: recv (size * n) = each rank's n host ints for this rank, in
  // rank order (the rows each will send); then rows of `width` elements, send_rows[r] of them
  // (consecutive in send, rank order) to rank r, recv_rows[r] from rank r into recv in rank order.
  void all_to_all_counts(const int* send, int* recv, int n);
  void all_to_all_rows(const float* send, const int* send_rows, float* recv, const int* recv_rows,
                       size_t width);

  // Point to point, for the pipeline. Between group_start() and group_end() sends and receives
  // are posted as they come (MPI_Isend / MPI_Irecv, tagged); group_end() returns once the
  // group's receives have landed. A send's buffer stays untouched until wait_send(buffer) or
  // wait_sends() returns.
  void group_start() { in_group_ = true; }
  void group_end();
  void send(const float* x, size_t n, int peer, int tag);
  void recv(float* x, size_t n, int peer, int tag);
  void wait_send(const void* buffer);
  void wait_sends();

  // Payload bytes this rank handed to MPI on this communicator (what `make bench` and
  // tools/reference/parallel_counts.py compare with the formulas; the ring volume follows from it).
  uint64_t payload_bytes = 0;
  void count(size_t bytes) { payload_bytes += bytes; }
  // Seconds this rank spent blocked in its collectives and their waits (not in point-to-point
  // transfers, which the pipeline executor times itself): the exposed communication.
  double busy_seconds = 0;

 private:
  void reduce(void* x, size_t n, MPI_Datatype type, MPI_Op op, size_t elem);
  int start_gather(const void* send, void* recv, size_t count, MPI_Datatype type, size_t elem);

  MPI_Comm comm_ = MPI_COMM_NULL;
  char name_[MPI_MAX_OBJECT_NAME] = "none";  // MPI_Comm_set_name's (the mesh's group names: tp, dpcp, pp, embed...)
  int size_ = 1, rank_ = 0;
  bool in_group_ = false;
  int ticket(MPI_Request request);
  std::vector<MPI_Request> reductions_, receives_;
  // The started calls by ticket; a slot is taken from start_* until wait() (MPI_Test may have
  // completed its request before).
  struct Ticket {
    MPI_Request request = MPI_REQUEST_NULL;
    bool taken = false;
  };
  std::vector<Ticket> tickets_;
  std::vector<std::pair<const void*, MPI_Request>> sends_;
};

// A failure some ranks met (a write that failed, a file only one rank reads), agreed on by all so
// that every rank takes the same way out together instead of one leaving a collective the others
// wait in: each rank passes its own ("" = none) and every rank gets back that of the lowest
// failing rank, or "". Collective over comm.
//
// Bounded: a rank with a failure of its own waits for the others at most `seconds`
// (kAgreeSeconds). A peer that does not come within that time is stuck in another collective
// (HDF5's own, waiting for this rank): this rank then prints "rank R: " + line(failure) on stderr
// and ends the job with MPI_Abort(status), so that no job waits for ever on a rank that gave up.
// Ranks without a failure wait as long as it takes (they would be waited for in turn).
constexpr double kAgreeSeconds = 10.0;
// kAgreeSeconds, or for tests only the seconds TESSERA_TEST_AGREE_SECONDS names (> 0): a test
// that meets the bound on purpose (tests/integration/test_write_errors.sh) need not wait 10 s
// each time. The same bound for the write watches (io/io_error_watch, the disk watch).
double agree_seconds();
// Ends the job from this rank with one line on stderr (MPI_Abort(status)). Of the ranks that give
// up at the same moment (a full disk fails them all) one line is printed: world rank w first
// waits min(w, 4) x 1.5 s, so the lowest one's abort ends the others before they print; of two
// threads of a rank, the first prints.
[[noreturn]] void abort_with_line(std::string text, int status);
std::string agree_on_failure(MPI_Comm comm, const std::string& failure);
std::string agree_on_failure(MPI_Comm comm, const std::string& failure,
                             const std::function<std::string(const std::string&)>& line,
                             int status, double seconds = agree_seconds());

// x (n), values the host holds, = their largest over the ranks of `mpi` (MPI_COMM_NULL: left as
// they are): for host values on a communicator of either backend, whose mpi() is Comm's
// communicator or NcclComm's MPI twin (the FP8 amaxes; NCCL moves device memory only).
inline void host_all_reduce_max(MPI_Comm mpi, float* x, size_t n) {
  if (mpi != MPI_COMM_NULL && n > 0)
    MPI_Allreduce(MPI_IN_PLACE, x, int(n), MPI_FLOAT, MPI_MAX, mpi);
}

}  // namespace tessera
