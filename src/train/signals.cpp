#include "train/signals.hpp"

#include <unistd.h>

#include <csignal>
#include <initializer_list>

namespace tessera {

namespace {
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_speaker = 0;

// Said at once (write(2) is async-signal-safe): a second Ctrl-C makes MPICH's mpiexec kill the
// ranks before the stop's own line, and the user must still learn what the first one did.
constexpr char kSigintLine[] =
    "stop: SIGINT received: stopping, exit 130 (once training has started, at the next step "
    "boundary with a checkpoint; a second Ctrl-C makes mpiexec kill the job without one)\n";

extern "C" void record_signal(int signal) {
  if (g_signal != 0) return;  // a second signal changes nothing: one stop is enough
  g_signal = signal;
  if (signal == SIGINT && g_speaker) {
    const ssize_t ignored = write(2, kSigintLine, sizeof kSigintLine - 1);
    (void)ignored;
  }
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and MPI waits resume instead of failing
  for (int s : {SIGUSR1, SIGTERM, SIGINT}) sigaction(s, &action, nullptr);
}

int stop_signal() { return g_signal; }

void speak_on_sigint(bool speaker) { g_speaker = speaker ? 1 : 0; }

}  // namespace tessera
