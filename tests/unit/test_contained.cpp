// run_contained (io/contained.hpp): what a reader in the child process did comes back to the
// parent as one UserError, and the parent survives a crash or a loop in it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "common/error.hpp"
#include "io/contained.hpp"

using namespace tessera;

namespace {

// The UserError run_contained threw, or "" when it returned.
UserError outcome(const std::function<void()>& check) {
  try {
    run_contained("file x.h5", check);
  } catch (const UserError& e) {
    return e;
  }
  return UserError("", 0);
}

}  // namespace

TEST(Contained, ReturnsWhenTheCheckReturns) {
  const pid_t parent = getpid();
  pid_t ran_in = parent;
  EXPECT_STREQ(outcome([&] { ran_in = getpid(); }).what(), "");
  EXPECT_EQ(ran_in, parent) << "the child's memory is its own: the parent sees no write";
}

TEST(Contained, TheChildsUserErrorComesBackWhole) {
  const UserError e = outcome([] { throw UserError("x.h5: vocab_size 0 out of range", kExitIO, false); });
  EXPECT_STREQ(e.what(), "x.h5: vocab_size 0 out of range");
  EXPECT_EQ(e.exit_code, kExitIO);
  EXPECT_FALSE(e.every_rank);
}

TEST(Contained, ACrashInTheChildIsOneLineNamingTheFile) {
  const UserError e = outcome([] { raise(SIGSEGV); });
  // Without sanitizers the child dies of the signal; under ASan its handler reports and exits 1.
  EXPECT_TRUE(std::string(e.what()).rfind("file x.h5: the HDF5 library crashed (signal 11, ", 0) == 0 ||
              std::string(e.what()).rfind("file x.h5: the HDF5 library failed (exit status ", 0) == 0)
      << e.what();
  EXPECT_EQ(e.exit_code, kExitBadInput);
}

TEST(Contained, AChildThatDoesNotEndIsKilledInTime) {
  const double saved = contained_seconds;
  contained_seconds = 0.5;
  const UserError e = outcome([] {
    for (;;) pause();
  });
  contained_seconds = saved;
  EXPECT_STREQ(e.what(), "file x.h5: reading it did not end in 0.5 s (a damaged HDF5 file makes "
                         "libhdf5 loop or allocate without bound)");
}
