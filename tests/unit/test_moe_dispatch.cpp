// The order of (token, choice) pairs through the experts (model/moe_dispatch.hpp): grouped by
// expert, token order within one, capacity dropping the latest tokens, written out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "model/moe_dispatch.hpp"

namespace tessera {
namespace {

TEST(MoeDispatch, RowsGroupedByExpertInTokenOrder) {
  // 4 tokens, k = 2, E = 3.
  const std::vector<int32_t> expert = {2, 0,  0, 1,  2, 1,  0, 2};
  const MoeDispatch d = plan_dispatch(expert.data(), 4, 2, 3, moe_capacity(0, 4, 2, 3));
  EXPECT_EQ(d.counts, (std::vector<int32_t>{3, 2, 3}));
  EXPECT_EQ(d.offsets, (std::vector<int32_t>{0, 3, 5, 8}));
  // expert 0: tokens 0, 1, 3; expert 1: tokens 1, 2; expert 2: tokens 0, 2, 3.
  EXPECT_EQ(d.token_of, (std::vector<int32_t>{0, 1, 3, 1, 2, 0, 2, 3}));
  EXPECT_EQ(d.slot_of, (std::vector<int32_t>{5, 0, 1, 3, 6, 4, 2, 7}));
  EXPECT_EQ(d.routed, d.counts);
  EXPECT_EQ(d.dropped, 0);
}

TEST(MoeDispatch, CapacityDropsTheLatestTokens) {
  // Every token chooses expert 0 first: capacity ceil(1.0 * 4 * 2 / 4) = 2 keeps tokens 0, 1.
  const std::vector<int32_t> expert = {0, 1,  0, 2,  0, 3,  0, 1};
  const int capacity = moe_capacity(1.0, 4, 2, 4);
  EXPECT_EQ(capacity, 2);
  const MoeDispatch d = plan_dispatch(expert.data(), 4, 2, 4, capacity);
  EXPECT_EQ(d.routed, (std::vector<int32_t>{4, 2, 1, 1}));
  EXPECT_EQ(d.counts, (std::vector<int32_t>{2, 2, 1, 1}));
  EXPECT_EQ(d.dropped, 2);
  EXPECT_EQ(d.slot_of[4], -1);  // token 2's choice of expert 0
  EXPECT_EQ(d.slot_of[6], -1);  // token 3's
  EXPECT_EQ(d.token_of, (std::vector<int32_t>{0, 1, 0, 3, 1, 2}));
  EXPECT_EQ(moe_capacity(1.25, 10, 2, 4), 7);  // ceil(6.25)
  EXPECT_THROW(plan_dispatch(std::vector<int32_t>{4}.data(), 1, 1, 4, 1), std::logic_error);
}

}  // namespace
}  // namespace tessera
