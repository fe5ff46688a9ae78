#include "parallel/comm.hpp"

#include <algorithm>

namespace tessera {

namespace {
constexpr size_t kBucket = size_t(1) << 22;  // elements per non-blocking all-reduce (16 MB)
constexpr size_t kChunk = size_t(1) << 30;   // MPI counts are int
}  // namespace

Comm::Comm(MPI_Comm comm, bool) : comm_(comm) {
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
}

void Comm::reduce(void* x, size_t n, MPI_Datatype type, MPI_Op op, size_t elem) {
  if (!active() || n == 0) return;
  for (size_t done = 0; done < n; done += kChunk)
    MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(x) + done * elem,
                  int(std::min(kChunk, n - done)), type, op, comm_);
  count(n * elem);
}

void Comm::start_all_reduce_sum(float* x, size_t n) {
  if (!active() || n == 0) return;
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
  MPI_Waitall(int(reductions_.size()), reductions_.data(), MPI_STATUSES_IGNORE);
  reductions_.clear();
}

void Comm::reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) {
  if (!active()) {
    if (send != recv) std::copy(send, send + count_per_rank, recv);
    return;
  }
  MPI_Reduce_scatter_block(send, recv, int(count_per_rank), MPI_FLOAT, MPI_SUM, comm_);
  count(size_t(size_) * count_per_rank * sizeof(float));
}

void Comm::all_gather(const float* send, float* recv, size_t count_per_rank) {
  if (!active()) {
    if (send != recv) std::copy(send, send + count_per_rank, recv);
    return;
  }
  const bool in_place = send == recv + size_t(rank_) * count_per_rank;
  MPI_Allgather(in_place ? MPI_IN_PLACE : send, int(count_per_rank), MPI_FLOAT, recv,
                int(count_per_rank), MPI_FLOAT, comm_);
  count(size_t(size_) * count_per_rank * sizeof(float));
}

void Comm::group_end() {
  in_group_ = false;
  MPI_Waitall(int(receives_.size()), receives_.data(), MPI_STATUSES_IGNORE);
  receives_.clear();
}

void Comm::send(const float* x, size_t n, int peer, int tag) {
  sends_.emplace_back(x, MPI_REQUEST_NULL);
  MPI_Isend(x, int(n), MPI_FLOAT, peer, tag, comm_, &sends_.back().second);
  count(n * sizeof(float));
}

void Comm::recv(float* x, size_t n, int peer, int tag) {
  receives_.emplace_back();
  MPI_Irecv(x, int(n), MPI_FLOAT, peer, tag, comm_, &receives_.back());
  if (!in_group_) group_end();
}

void Comm::wait_send(const void* buffer) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->first != buffer) {
      ++it;
      continue;
    }
    MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    it = sends_.erase(it);
  }
}

void Comm::wait_sends() {
  for (auto& [buffer, request] : sends_) MPI_Wait(&request, MPI_STATUS_IGNORE);
  sends_.clear();
}

std::string agree_on_failure(MPI_Comm comm, const std::string& failure) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = failure.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return "";
  int length = rank == first ? int(failure.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  std::string text = rank == first ? failure : std::string(size_t(length), '\0');
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  return text;
}

}  // namespace tessera
