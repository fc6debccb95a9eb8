// Two-level memory through the manager: pools that draw pages from shared slabs give memory to
// whichever class needs it, refuse all or nothing, and keep their invariants.
#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv {
namespace {

using testing::Driver;
using testing::Full;
using testing::MakeConfig;
using testing::Seq;
using testing::StateGroup;

// 8 slabs; a slab holds 4 token pages (4 tokens each) or 1 recurrent state.
ManagerConfig Hybrid() {
  ManagerConfig c = MakeConfig({33, 9}, {Full(4, 0), StateGroup(1)});
  c.arena.num_slabs = 8;
  c.arena.pages_per_slab = {4, 1};
  return c;
}

TEST(TwoLevelTest, ConfigMustDescribeTheSlabs) {
  ManagerConfig c = Hybrid();
  c.pool_blocks[0] = 30;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  c = Hybrid();
  c.arena.pages_per_slab = {4};
  EXPECT_NE(c.Validate().message().find("pages_per_slab has 1 entries for 2 pools"),
            std::string::npos);
  c = Hybrid();
  c.arena.num_slabs = -1;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(TwoLevelTest, MemoryFollowsDemandBetweenClasses) {
  Driver d(Hybrid());
  KvCacheManager& m = d.m();
  EXPECT_EQ(m.Usage(0).num_blocks, 0);  // nothing carved yet
  // A long prompt takes most slabs as token pages: 64 tokens = 16 pages = 4 slabs, plus its
  // live state and the checkpoint before the prompt's end.
  d.Add(1, Seq(64, 1000));
  d.Prefill(1);
  EXPECT_EQ(m.Usage(0).num_blocks, 16);
  EXPECT_EQ(m.Usage(1).num_blocks, 2);
  // Full: a second request of 12 pages and 2 states would need 5 of the 2 slabs left; refused,
  // all or nothing.
  d.Add(3, Seq(48, 9000));
  const PoolUsage before0 = m.Usage(0), before1 = m.Usage(1);
  const Status refused = m.Allocate(3, 48);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("slab"), std::string::npos) << refused.message();
  d.Check();
  EXPECT_EQ(m.Usage(0).num_blocks, before0.num_blocks);
  EXPECT_EQ(m.Usage(0).num_free, before0.num_free);
  EXPECT_EQ(m.Usage(1).num_blocks, before1.num_blocks);
  d.Free(1);
  d.Free(3);
  // Now short requests: each needs one token page and one state. Six of them fit only if the
  // token slabs go back and become state pages; the first phase's split would hold 2.
  for (RequestId id = 10; id < 16; ++id) {
    d.Add(id, Seq(3, static_cast<int32_t>(100 * id)));
    d.Prefill(id);
  }
  EXPECT_EQ(m.Usage(1).num_blocks, 6);
  EXPECT_EQ(m.Usage(0).num_blocks, 8);  // 6 pages in 2 slabs
  for (RequestId id = 10; id < 16; ++id)
    d.Free(id);
  EXPECT_EQ(m.CheckInvariants().ok(), true);
}

}  // namespace
}  // namespace hkv
