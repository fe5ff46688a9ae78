#pragma once
// `tessera train`: builds the run from a Config and walks the step loop.
#include <mpi.h>

#include "config/config.hpp"

namespace tessera {

// Trains as the deck says; returns the process exit status. User errors throw UserError.
int train(MPI_Comm world, const Config& config);

}  // namespace tessera
