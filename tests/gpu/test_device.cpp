// The CUDA backend's memory on a GPU: the arena's single allocation and its alignment, the pinned
// loader memory and the token upload on the copy stream, the device pick from a node-local rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/arena.hpp"
#include "backend/cuda/ops.hpp"
#include "common/error.hpp"
#include "device/select.hpp"
#include "device/stream_wait.hpp"
#include "gpu_test.hpp"

namespace tessera::gpu_test {
namespace {

TEST(Device, PickDevice) {
  EXPECT_EQ(device::pick_device(0, 1), 0);
  EXPECT_EQ(device::pick_device(3, 1), 0);  // one visible GPU (bound per rank): always 0
  EXPECT_EQ(device::pick_device(3, 4), 3);
  EXPECT_EQ(device::pick_device(4, 4), -1);  // more ranks on the node than GPUs
}

TEST(Device, ArenaAlignsEveryBuffer) {
  Arena arena(cuda::memory());
  const size_t a = arena.add("odd", 1001), b = arena.add("floats", 4 * 37), c = arena.add("empty", 0);
  arena.allocate();
  for (size_t h : {a, b, c})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.get<char>(h)) % 256, 0u) << "buffer " << h;
  EXPECT_GE(arena.total_bytes(), size_t(1001 + 4 * 37));
  EXPECT_NE(arena.report().find("odd: 0.0 MB"), std::string::npos) << arena.report();
  cuda::zero(arena.get<char>(a), 1001);
  cuda::sync();
}

TEST(Device, PinnedUploadRoundTrip) {
  const size_t n = 100003;
  const Allocator pinned = cuda::loader_memory();
  auto* host = static_cast<int32_t*>(pinned.allocate(n * sizeof(int32_t)));
  for (size_t i = 0; i < n; i++) host[i] = int32_t(i * 2654435761u);
  Dev<float> dev_buf(n);  // int32 payload in a float-sized buffer: only bytes matter here
  cuda::upload(dev_buf.get(), host, n * sizeof(int32_t));
  cuda::await_uploads();  // compute stream work after this sees the batch
  std::vector<int32_t> back(n);
  cuda::to_host(back.data(), dev_buf.get(), n * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], host[i]) << "element " << i;
  pinned.release(host);
}

// A collective whose peer hangs without an error (the emulator's TESSERA_EMU_NCCL_HANG=0: the
// streams never finish): the host's bounded wait gives up after its limit (run.hang_timeout) with
// one line naming what it waited for, exit 5 as the watchdog's; without the limit it would spin
// until the job's wall time.
TEST(Device, WaitStreamGivesUpOnAStreamThatNeverFinishes) {
#ifndef TESSERA_CUDA_EMU
  GTEST_SKIP() << "needs the emulator's hung collective";
#else
  device::set_wait_limit(1.0);
  setenv("TESSERA_EMU_NCCL_HANG", "0", 1);
  const auto start = std::chrono::steady_clock::now();
  std::string line;
  int code = 0;
  try {
    device::wait_stream(device::stream(), "the test's sums");
  } catch (const UserError& e) {
    line = e.what();
    code = e.exit_code;
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  unsetenv("TESSERA_EMU_NCCL_HANG");
  device::set_wait_limit(0);
  EXPECT_EQ(code, kExitHang) << line;
  EXPECT_NE(line.find("wait_stream failed: the test's sums: the device did not finish in 1 s "
                      "(run.hang_timeout, 900 s when unset): a collective's peer is lost or hangs"),
            std::string::npos)
      << line;
  EXPECT_GE(took, 1.0);
  EXPECT_LT(took, 3.0);
  device::wait_stream(device::stream(), "the test's sums");  // the streams finish again
#endif
}

}  // namespace
}  // namespace tessera::gpu_test
