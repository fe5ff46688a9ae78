#include "train/signals.hpp"

#include <csignal>
#include <initializer_list>

namespace tessera {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void record_signal(int signal) {
  if (g_signal == 0) g_signal = signal;  // a second signal changes nothing: one stop is enough
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

}  // namespace tessera
