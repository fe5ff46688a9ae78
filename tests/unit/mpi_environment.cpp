// MPI for the unit tests: checkpoint code is collective even on one rank.
#include <gtest/gtest.h>
#include <mpi.h>

namespace {

class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init(nullptr, nullptr);
  }
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

[[maybe_unused]] ::testing::Environment* const kMpi =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

}  // namespace
