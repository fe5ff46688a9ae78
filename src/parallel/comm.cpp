#include "parallel/comm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace tessera {

namespace {
constexpr size_t kBucket = size_t(1) << 22;  // elements per non-blocking all-reduce (16 MB)
constexpr size_t kChunk = size_t(1) << 30;   // MPI counts are int
}  // namespace

namespace trace {

namespace {

struct Call {
  char comm[MPI_MAX_OBJECT_NAME];
  const char* op;
  size_t bytes;
  int peer;
  long step;
  int micro;
  double start, end;  // seconds on the steady clock; end < 0 while in flight
};

std::mutex mutex;  // the ring is written by the training thread, read by the watchdog
Call ring[kTraceCalls];
uint64_t recorded = 0;
int open_slot = -1;
long step_now = 0;
int micro_now = -1;
const char* phase_now = "start-up";
std::atomic<uint64_t> ticks{0};

double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string describe(const Call& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %s %zu B%s", c.comm, c.op, c.bytes,
                c.peer >= 0 ? (" peer " + std::to_string(c.peer)).c_str() : "");
  return buf;
}

}  // namespace

void set_step(long step) {
  const std::lock_guard<std::mutex> lock(mutex);
  step_now = step;
  micro_now = -1;
  ++ticks;
}
void set_micro(int micro) {
  const std::lock_guard<std::mutex> lock(mutex);
  micro_now = micro;
}
void set_phase(const char* phase) {
  const std::lock_guard<std::mutex> lock(mutex);
  phase_now = phase;
  ++ticks;
}
uint64_t progress() { return ticks.load(); }

bool in_call(std::string* what) {
  const std::lock_guard<std::mutex> lock(mutex);
  if (open_slot < 0) return false;
  if (what) *what = describe(ring[open_slot]);
  return true;
}

std::string report(double now_steady) {
  const std::lock_guard<std::mutex> lock(mutex);
  std::string out = "step " + std::to_string(step_now) + ", micro-batch " +
                    std::to_string(micro_now) + ", phase " + phase_now + "\n" +
                    "last " + std::to_string(std::min<uint64_t>(recorded, kTraceCalls)) +
                    " communication calls, oldest first (times in seconds before this report):\n";
  const uint64_t first = recorded > kTraceCalls ? recorded - kTraceCalls : 0;
  for (uint64_t i = first; i < recorded; ++i) {
    const Call& c = ring[i % kTraceCalls];
    char buf[384];
    std::snprintf(buf, sizeof buf, "%s step %ld micro %d started %.3f %s\n", describe(c).c_str(),
                  c.step, c.micro, now_steady - c.start,
                  c.end < 0 ? "IN FLIGHT" : ("took " + std::to_string(c.end - c.start)).c_str());
    out += buf;
  }
  return out;
}

double now() { return clock_seconds(); }
Scope::Scope(const char* comm, const char* op, size_t bytes, int peer) {
  const std::lock_guard<std::mutex> lock(mutex);
  slot_ = int(recorded++ % kTraceCalls);
  Call& c = ring[slot_];
  std::snprintf(c.comm, sizeof c.comm, "%s", comm);
  c.op = op;
  c.bytes = bytes;
  c.peer = peer;
  c.step = step_now;
  c.micro = micro_now;
  c.start = clock_seconds();
  c.end = -1;
  open_slot = slot_;
  ++ticks;
}

Scope::~Scope() {
  const std::lock_guard<std::mutex> lock(mutex);
  ring[slot_].end = clock_seconds();
  open_slot = -1;
  ++ticks;
}

}  // namespace trace

namespace {
// Adds a blocking call's seconds to the communicator's busy time.
struct Busy {
  double& total;
  double start = trace::now();
  ~Busy() { total += trace::now() - start; }
};
}  // namespace

Comm::Comm(MPI_Comm comm, bool) : comm_(comm) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
    int length = 0;
    MPI_Comm_get_name(comm_, name_, &length);
  }
}

void Comm::reduce(void* x, size_t n, MPI_Datatype type, MPI_Op op, size_t elem) {
  if (!active() || n == 0) return;
  const trace::Scope call(name_, op == MPI_MAX ? "all_reduce_max" : "all_reduce_sum", n * elem);
  const Busy busy{busy_seconds};
  for (size_t done = 0; done < n; done += kChunk)
    MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(x) + done * elem,
                  int(std::min(kChunk, n - done)), type, op, comm_);
  count(n * elem);
}

void Comm::start_all_reduce_sum(float* x, size_t n) {
  if (!active() || n == 0) return;
  const trace::Scope call(name_, "start_all_reduce_sum", n * sizeof(float));
  for (size_t b = 0; b < n; b += kBucket) {
    reductions_.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, x + b, int(std::min(kBucket, n - b)), MPI_FLOAT, MPI_SUM, comm_,
                   &reductions_.back());
  }
  count(n * sizeof(float));
  // MPICH progresses non-blocking collectives only inside MPI calls: give it one now.
  int done = 0;
  MPI_Testall(int(reductions_.size()), reductions_.data(), &done, MPI_STATUSES_IGNORE);
}

void Comm::wait_reductions() {
  if (reductions_.empty()) return;
  const trace::Scope call(name_, "wait_reductions", 0);
  const Busy busy{busy_seconds};
  MPI_Waitall(int(reductions_.size()), reductions_.data(), MPI_STATUSES_IGNORE);
  reductions_.clear();
}

void Comm::reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) {
  if (!active()) {
    if (send != recv) std::copy(send, send + count_per_rank, recv);
    return;
  }
  const trace::Scope call(name_, "reduce_scatter_sum", size_t(size_) * count_per_rank * sizeof(float));
  const Busy busy{busy_seconds};
  MPI_Reduce_scatter_block(send, recv, int(count_per_rank), MPI_FLOAT, MPI_SUM, comm_);
  count(size_t(size_) * count_per_rank * sizeof(float));
}

float* Comm::reduce_scatter_sum_in_place(float* x, size_t count_per_rank) {
  if (!active()) return x;
  const trace::Scope call(name_, "reduce_scatter_sum", size_t(size_) * count_per_rank * sizeof(float));
  const Busy busy{busy_seconds};
  MPI_Reduce_scatter_block(MPI_IN_PLACE, x, int(count_per_rank), MPI_FLOAT, MPI_SUM, comm_);
  count(size_t(size_) * count_per_rank * sizeof(float));
  return x;
}

void Comm::all_gather(const float* send, float* recv, size_t count_per_rank) {
  if (!active()) {
    if (send != recv) std::copy(send, send + count_per_rank, recv);
    return;
  }
  const bool in_place = send == recv + size_t(rank_) * count_per_rank;
  const trace::Scope call(name_, "all_gather", size_t(size_) * count_per_rank * sizeof(float));
  const Busy busy{busy_seconds};
  MPI_Allgather(in_place ? MPI_IN_PLACE : send, int(count_per_rank), MPI_FLOAT, recv,
                int(count_per_rank), MPI_FLOAT, comm_);
  count(size_t(size_) * count_per_rank * sizeof(float));
}

int Comm::ticket(MPI_Request request) {
  for (size_t i = 0; i < tickets_.size(); ++i)
    if (!tickets_[i].taken) {
      tickets_[i] = {request, true};
      return int(i);
    }
  tickets_.push_back({request, true});
  return int(tickets_.size()) - 1;
}

int Comm::start_all_gather(const float* send, float* recv, size_t count_per_rank) {
  return start_gather(send, recv, count_per_rank, MPI_FLOAT, sizeof(float));
}

int Comm::start_all_gather(const uint8_t* send, uint8_t* recv, size_t count_per_rank) {
  return start_gather(send, recv, count_per_rank, MPI_BYTE, 1);
}

int Comm::start_gather(const void* send, void* recv, size_t count_per_rank, MPI_Datatype type,
                       size_t elem) {
  const size_t bytes = count_per_rank * elem;
  if (!active()) {
    if (send != recv) std::memcpy(recv, send, bytes);
    return -1;
  }
  const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * bytes;
  const trace::Scope call(name_, "start_all_gather", size_t(size_) * bytes);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallgather(in_place ? MPI_IN_PLACE : send, int(count_per_rank), type, recv,
                 int(count_per_rank), type, comm_, &request);
  count(size_t(size_) * bytes);
  return ticket(request);
}

int Comm::start_reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) {
  if (!active()) {
    if (send != recv) std::copy(send, send + count_per_rank, recv);
    return -1;
  }
  const trace::Scope call(name_, "start_reduce_scatter_sum",
                          size_t(size_) * count_per_rank * sizeof(float));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ireduce_scatter_block(send, recv, int(count_per_rank), MPI_FLOAT, MPI_SUM, comm_, &request);
  count(size_t(size_) * count_per_rank * sizeof(float));
  return ticket(request);
}

void Comm::wait(int t) {
  if (t < 0) return;
  Ticket& ticket = tickets_[size_t(t)];
  if (ticket.request != MPI_REQUEST_NULL) {
    const trace::Scope call(name_, "wait", 0);
    const Busy busy{busy_seconds};
    MPI_Wait(&ticket.request, MPI_STATUS_IGNORE);
  }
  ticket.taken = false;
}

void Comm::progress() {
  for (Ticket& t : tickets_) {
    if (!t.taken || t.request == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Test(&t.request, &done, MPI_STATUS_IGNORE);
  }
}

void Comm::all_to_all_counts(const int* send, int* recv, int n) {
  if (!active()) {
    std::copy(send, send + n, recv);
    return;
  }
  const trace::Scope call(name_, "all_to_all_counts", size_t(size_) * n * sizeof(int));
  const Busy busy{busy_seconds};
  MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, comm_);
}

void Comm::all_to_all_rows(const float* send, const int* send_rows, float* recv,
                           const int* recv_rows, size_t width) {
  const size_t P = static_cast<size_t>(size_);
  std::vector<int> sc(P), sd(P), rc(P), rd(P);
  size_t bytes = 0;
  for (int r = 0, s_at = 0, r_at = 0; r < size_; ++r) {
    sc[size_t(r)] = int(size_t(send_rows[r]) * width), sd[size_t(r)] = s_at;
    rc[size_t(r)] = int(size_t(recv_rows[r]) * width), rd[size_t(r)] = r_at;
    s_at += sc[size_t(r)], r_at += rc[size_t(r)];
    if (r != rank_) bytes += size_t(sc[size_t(r)]) * sizeof(float);
  }
  if (!active()) {
    std::copy(send, send + sc[0], recv);
    return;
  }
  const trace::Scope call(name_, "all_to_all_rows", bytes);
  const Busy busy{busy_seconds};
  MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT,
                comm_);
  count(bytes);
}

void Comm::group_end() {
  in_group_ = false;
  if (receives_.empty()) return;
  const trace::Scope call(name_, "wait_receives", 0);
  MPI_Waitall(int(receives_.size()), receives_.data(), MPI_STATUSES_IGNORE);
  receives_.clear();
}

void Comm::send(const float* x, size_t n, int peer, int tag) {
  const trace::Scope call(name_, "isend", n * sizeof(float), peer);
  sends_.emplace_back(x, MPI_REQUEST_NULL);
  MPI_Isend(x, int(n), MPI_FLOAT, peer, tag, comm_, &sends_.back().second);
  count(n * sizeof(float));
}

void Comm::recv(float* x, size_t n, int peer, int tag) {
  {
    const trace::Scope call(name_, "irecv", n * sizeof(float), peer);
    receives_.emplace_back();
    MPI_Irecv(x, int(n), MPI_FLOAT, peer, tag, comm_, &receives_.back());
  }
  if (!in_group_) group_end();
}

void Comm::wait_send(const void* buffer) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->first != buffer) {
      ++it;
      continue;
    }
    {
      const trace::Scope call(name_, "wait_send", 0);
      MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    }
    it = sends_.erase(it);
  }
}

void Comm::wait_sends() {
  if (sends_.empty()) return;
  const trace::Scope call(name_, "wait_sends", 0);
  for (auto& [buffer, request] : sends_) MPI_Wait(&request, MPI_STATUS_IGNORE);
  sends_.clear();
}

std::string agree_on_failure(MPI_Comm comm, const std::string& failure) {
  return agree_on_failure(comm, failure, [](const std::string& why) { return why; }, 1);
}

double agree_seconds() {
  static const double seconds = [] {
    const char* v = std::getenv("TESSERA_TEST_AGREE_SECONDS");
    const double s = v ? std::atof(v) : 0.0;
    return s > 0 ? s : kAgreeSeconds;
  }();
  return seconds;
}

void abort_with_line(std::string text, int status) {
  static std::atomic<bool> said{false};
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * std::min(world_rank, 4)));
  if (!said.exchange(true)) {
    for (char& c : text)
      if (c == '\n' || c == '\r') c = ' ';
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }
  // The launcher forwards output through a pipe: give it a moment before the job dies.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(MPI_COMM_WORLD, status);
  std::abort();  // not reached: MPI_Abort does not return
}

std::string agree_on_failure(MPI_Comm comm, const std::string& failure,
                             const std::function<std::string(const std::string&)>& line,
                             int status, double seconds) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  char name[MPI_MAX_OBJECT_NAME] = "";
  int name_length = 0;
  MPI_Comm_get_name(comm, name, &name_length);
  const trace::Scope call(name, "agree_on_failure", sizeof(int));
  int first = failure.empty() ? size : rank;
  // Non-blocking: a rank that failed waits for the others a bounded time. A peer that never
  // comes is stuck in a collective of its own (HDF5's, on HDF5's communicator) that waits for
  // this rank: this rank then prints its line and ends the job.
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm, &request);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  for (long polls = 0; !done; ++polls) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (!failure.empty() && std::chrono::steady_clock::now() > deadline)
      abort_with_line("rank " + std::to_string(rank) + ": " + line(failure), status);
    // Polled as a blocking call would at first (an agreement at every step boundary), then
    // without holding a core.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (first == size) return "";
  int length = rank == first ? int(failure.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  std::string text = rank == first ? failure : std::string(size_t(length), '\0');
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  return text;
}

}  // namespace tessera
