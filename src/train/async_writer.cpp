#include "train/async_writer.hpp"

#include <chrono>
#include <exception>

#include "common/error.hpp"
#include "io/hdf5_util.hpp"

namespace tessera {

AsyncWriter::AsyncWriter(MPI_Comm world) { MPI_Comm_dup(world, &comm_); }

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncWriter::start(std::function<std::vector<std::string>(MPI_Comm)> write) {
  done_ = false;
  lines_.clear();
  error_.clear();
  thread_ = std::thread([this, write = std::move(write)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::lock_guard<std::mutex> lock(hdf5_mutex());
      lines_ = write(comm_);
    } catch (const UserError& e) {
      error_ = e.what();
      error_code_ = e.exit_code;
      error_every_rank_ = e.every_rank;
    } catch (const std::exception& e) {
      error_ = std::string("checkpoint: background write failed: ") + e.what();
      error_code_ = kExitIO;
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done_ = true;
  });
}

std::vector<std::string> AsyncWriter::wait(double* seconds) {
  if (!thread_.joinable()) return {};
  thread_.join();
  if (seconds) *seconds = seconds_;
  if (!error_.empty()) throw UserError(error_, error_code_, error_every_rank_);
  return lines_;
}

}  // namespace tessera
