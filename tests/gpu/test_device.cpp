// The CUDA backend's memory on a GPU: the arena's single allocation and its alignment, the pinned
// loader memory and the token upload on the copy stream, the device pick from a node-local rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/arena.hpp"
#include "backend/cuda/ops.hpp"
#include "device/select.hpp"
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

}  // namespace
}  // namespace tessera::gpu_test
