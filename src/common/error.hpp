#pragma once
// Errors a user can cause (deck, data, checkpoint, layout). main() prints the message as one line
// and exits with exit_code: 2 for bad input, 1 for I/O failures. No stack trace.
//
// `every_rank` says whether every rank meets the same error (a deck or layout problem, a file
// every rank opens): then rank 0 alone prints it. An error only some ranks meet (the samples one
// data-parallel rank reads) is printed by the rank that met it, and MPI_Abort ends the others.
#include <stdexcept>
#include <string>

namespace tessera {

inline constexpr int kExitIO = 1;
inline constexpr int kExitBadInput = 2;
// Stopped early by SIGUSR1, SIGTERM or run.max_minutes after writing a checkpoint: a job script
// requeues (or the next job of a chain continues) on this status.
inline constexpr int kExitRequeue = 3;
// Stopped by the anomaly policy (train.anomaly_action: stop, or a skip or rollback that could not
// go on) before a poisoned update reached the weights, or a checkpoint refused because the weights
// or moments are not finite: the last good checkpoint is kept.
inline constexpr int kExitAnomaly = 4;
// Ended by the hang watchdog (run.hang_timeout): no rank made progress for that long; the
// forensics are in <run.dir>/hang/.
inline constexpr int kExitHang = 5;
// Stopped by SIGINT after writing a checkpoint (128 + SIGINT, as a shell reports it).
inline constexpr int kExitInterrupted = 130;

struct UserError : std::runtime_error {
  int exit_code;
  bool every_rank;
  explicit UserError(const std::string& message, int code = kExitBadInput, bool every_rank = true)
      : std::runtime_error(message), exit_code(code), every_rank(every_rank) {}
};

}  // namespace tessera
