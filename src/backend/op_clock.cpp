#include "backend/op_clock.hpp"

namespace tessera::op_clock {

// Per thread: the loader's and the checkpoint writer's threads may copy through the backend;
// only the training thread's ops are the step's.
State& state() {
  static thread_local State s;
  return s;
}

}  // namespace tessera::op_clock
