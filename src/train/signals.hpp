#pragma once
// Stop requests from the batch system: SIGUSR1 and SIGTERM (sent by Slurm's --signal and by PBS
// before the wall time ends) and SIGINT only record that they came. The step loop asks at each
// step boundary, the ranks agree (they receive signals at different moments), and the run ends
// with a checkpoint.
namespace tessera {

// Installs the handlers; the first signal received is the one reported.
void install_stop_handlers();

// The signal number received so far, or 0.
int stop_signal();

// Whether this rank (world rank 0) says on stderr, the moment a SIGINT comes, what it will do.
void speak_on_sigint(bool speaker);

}  // namespace tessera
