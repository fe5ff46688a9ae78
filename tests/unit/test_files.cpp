// Checked file I/O (common/files, common/cli): what a path is, bounded reads, writes whose
// failures come back with their reason (a device that is always full stands in for a full disk),
// and command-line integers range-checked in 64 bits.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "parallel/comm.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() /
                  ("tessera_files_" + std::to_string(getpid()) + "_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::pair<int, std::string> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return {e.exit_code, e.what()};
  }
  return {0, ""};
}

}  // namespace

TEST(Files, WhatAPathIs) {
  Dir d;
  const std::string fifo = d / "fifo", loop = d / "loop", file = d / "file";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(loop, loop);
  std::ofstream(file) << "x";
  EXPECT_NO_THROW(require_regular_file(file, "token file"));
  EXPECT_EQ(error_of([&] { require_regular_file(fifo, "token file"); }),
            std::make_pair(kExitBadInput, "token file " + fifo + " is a FIFO (named pipe), not a file"));
  EXPECT_EQ(error_of([&] { require_regular_file(d.path.string(), "deck"); }),
            std::make_pair(kExitBadInput, "deck " + d.path.string() + " is a directory, not a file"));
  EXPECT_EQ(error_of([&] { open_regular_file("/dev/null", "checkpoint"); }),
            std::make_pair(kExitBadInput, std::string("checkpoint /dev/null is a character device, not a file")));
  EXPECT_EQ(error_of([&] { require_regular_file(loop, "deck"); }),
            std::make_pair(kExitIO, "cannot read deck " + loop +
                                        ": Too many levels of symbolic links (a symbolic link loop)"));
  EXPECT_EQ(error_of([&] { require_regular_file(d / "none", "deck"); }),
            std::make_pair(kExitIO, "cannot read deck " + d / "none" + ": No such file or directory"));
}

TEST(Files, ReadsAreBounded) {
  Dir d;
  std::ofstream(d / "small") << std::string(100, 'a');
  EXPECT_EQ(read_regular_file(d / "small", "deck", 100), std::string(100, 'a'));
  EXPECT_EQ(error_of([&] { read_regular_file(d / "small", "deck", 99); }).first, kExitBadInput);
}

// Every failed write comes back with its reason; nothing is left half-written.
TEST(Files, FailedWritesSayWhy) {
  Dir d;
  EXPECT_EQ(write_file_atomically(d / "ok", "text\n", true), "");
  std::ifstream in(d / "ok");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "text");
  // The temporary file is where the bytes go first: make it a device that is always full.
  fs::create_symlink("/dev/full", d / "full.tmp");
  EXPECT_EQ(write_file_atomically(d / "full", "text\n", false),
            "cannot write " + d / "full" + ": No space left on device");
  EXPECT_FALSE(fs::exists(d / "full"));
  EXPECT_FALSE(fs::is_symlink(d / "full.tmp"));
  AppendFile log;
  fs::create_symlink("/dev/full", d / "metrics.jsonl");
  EXPECT_EQ(log.open(d / "metrics.jsonl"), "");
  EXPECT_EQ(log.append("{}\n"), "cannot write " + d / "metrics.jsonl" + ": No space left on device");
  EXPECT_EQ(make_directories(d / "ok"), "cannot create directory " + d / "ok" + ": it is a file");
}

TEST(Files, IntegersAreRangeChecked) {
  EXPECT_EQ(parse_int("--count", "9223372036854775807", 1, INT64_MAX), INT64_MAX);
  EXPECT_EQ(error_of([] { parse_int("--tokens", "4294967297", 0, 1 << 30); }).second,
            "--tokens: expected an integer from 0 to 1073741824, got '4294967297'");
  EXPECT_EQ(error_of([] { parse_int("--count", "9223372036854775808", 1, INT64_MAX); }).second,
            "--count: expected an integer from 1 to 9223372036854775807, got '9223372036854775808'");
  EXPECT_EQ(error_of([] { parse_int("--batches", "12x", 1, 10); }).first, kExitBadInput);
}

TEST(Files, MemoryAndAgreement) {
  EXPECT_GT(available_host_memory(), uint64_t(1) << 20);
  EXPECT_EQ(error_of([] { require_host_memory(uint64_t(1) << 62, "the test"); }).first,
            kExitBadInput);
  // One rank: its own failure is the agreed one.
  EXPECT_EQ(agree_on_failure(MPI_COMM_SELF, "disk full"), "disk full");
  EXPECT_EQ(agree_on_failure(MPI_COMM_SELF, ""), "");
}
