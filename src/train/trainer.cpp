// `tessera train`: the outline of a run. Each part is a member of Run (train/run.hpp), in a file
// named for it: the set-up (startup.cpp), the start from a checkpoint or the seed
// (checkpointing.cpp), the start-up log (report.cpp), the steps and the end (step_loop.cpp).
#include "train/trainer.hpp"

#include "train/run.hpp"

namespace tessera {

int train(MPI_Comm world, const Config& cfg) {
  Run run(world, cfg);  // everything checked, then allocated
  run.restore();        // fresh, checkpoint.init_from, or the restart checkpoint
  run.announce();
  if (const std::optional<int> stopped = run.loop()) return *stopped;
  return run.finish();
}

}  // namespace tessera
