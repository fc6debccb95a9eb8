// Evict (sparse KV): a full-attention group packs the tokens a policy keeps into its first slots
// and returns whole blocks; shared and published blocks are never written; nothing computed
// after an eviction is published.
#include <algorithm>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

int32_t Held(const KvCacheManager& m, int32_t pool) {
  const PoolUsage u = m.Usage(pool);
  return u.num_blocks - u.num_free;
}

TEST(EvictTest, WholeBlocksReturnAndSharedOnesAreReplaced) {
  Driver d(MakeConfig({32}, {Full(4)}));
  d.Add(1, Seq(20));
  d.Prefill(1);
  const std::vector<int32_t> before = d.Table(1, 0);
  ASSERT_EQ(before.size(), 5u);
  ASSERT_EQ(Held(d.m(), 0), 5);
  // Keep 8 of 20; the first 4 slots (block 0) stay in place.
  const EvictResult e = d.m().Evict(1, 0, 8, 4).value();
  d.Check();
  EXPECT_EQ(e.keep, 8);
  EXPECT_EQ(e.write_from, 4);
  EXPECT_EQ(e.blocks_released, 3);
  EXPECT_EQ(e.blocks_replaced, 1);  // block 1 was published: written only as a private copy
  const std::vector<int32_t> after = d.Table(1, 0);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_NE(after[1], before[1]);
  for (int32_t b : before)
    EXPECT_NE(after[1], b);  // the bytes of every old block survive until the next allocation
  EXPECT_EQ(Held(d.m(), 0), 2);
  // Released tail first, then the replaced block: a cached prefix's head outlives its tail.
  const std::vector<int32_t> order = ManagerProbe::FreeListOrder(d.m(), 0);
  const std::vector<int32_t> released = {before[4], before[3], before[2], before[1]};
  ASSERT_GE(order.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(order.end() - 4, order.end()), released);
  // The request's published prompt blocks stay cached for others.
  d.Add(2, Seq(20));
  EXPECT_EQ(d.Lookup(2).tokens, 16);
  // Decoding continues from slot 8: position 20 sits in slot 8, block 2 of the table.
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{7}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  d.Check();
  std::vector<int64_t> slots;
  ASSERT_TRUE(d.m().SlotMapping(1, 0, 20, 21, slots).ok());
  const std::vector<int32_t> grown = d.Table(1, 0);
  ASSERT_EQ(grown.size(), 3u);
  EXPECT_EQ(slots[0], int64_t{grown[2]} * 4);
  ASSERT_TRUE(d.m().Commit(1, 21).ok());
  d.Check();
  d.Free(1);
  d.Free(2);
}

TEST(EvictTest, PrivateBlocksAreWrittenInPlaceAndRepeatedEvictionsAccumulate) {
  ManagerConfig c = MakeConfig({32}, {Full(4)});
  c.enable_prefix_caching = false;
  Driver d(c);
  d.Add(1, Seq(12));
  d.Prefill(1);
  const std::vector<int32_t> before = d.Table(1, 0);
  EvictResult e = d.m().Evict(1, 0, 6, 2).value();
  EXPECT_EQ(e.write_from, 2);
  EXPECT_EQ(e.blocks_replaced, 0);
  EXPECT_EQ(e.blocks_released, 1);
  EXPECT_EQ(d.Table(1, 0), std::vector<int32_t>(before.begin(), before.begin() + 2));
  d.Check();
  for (int32_t t = 0; t < 5; ++t)
    d.Decode(1, t);  // positions 12..16 -> slots 6..10
  EXPECT_EQ(d.Table(1, 0).size(), 3u);
  // 11 slots held; keep 5, nothing in place.
  e = d.m().Evict(1, 0, 5, 0).value();
  EXPECT_EQ(e.write_from, 0);
  EXPECT_EQ(e.blocks_released, 1);
  d.Check();
  d.Decode(1, 9);  // position 17 -> slot 5
  std::vector<int64_t> slots;
  ASSERT_TRUE(d.m().SlotMapping(1, 0, 18, 18, slots).ok());
  const Status old = d.m().SlotMapping(1, 0, 10, 12, slots);
  EXPECT_EQ(old.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(old.message().find("no fixed slot"), std::string::npos) << old.message();
  d.Free(1);
}

TEST(EvictTest, NothingComputedAfterAnEvictionIsPublished) {
  // Attention, a window and a recurrent state: after the eviction the request's later blocks
  // and states depend on what it dropped, so another request with the same tokens must not hit
  // them; what it published before stays.
  ManagerConfig c = MakeConfig({64, 64, 64}, {Full(4, 0), Window(6, 4, 1), StateGroup(2)});
  Driver d(c);
  const std::vector<int32_t> prompt = Seq(16);
  d.Add(1, prompt);
  d.Prefill(1);
  ASSERT_TRUE(d.m().Evict(1, 0, 8, 0).ok());
  d.Check();
  d.m().TakeEvents();
  std::vector<int32_t> out;
  for (int32_t t = 0; t < 12; ++t) {
    d.Decode(1, 500 + t);
    out.push_back(500 + t);
    // The window keeps moving: publishing stopped, releasing did not.
    const std::vector<int32_t> window = d.Table(1, 1);
    EXPECT_LE(window.size() - std::count(window.begin(), window.end(), 0), 3u) << "step " << t;
  }
  d.Free(1);
  // The one thing stored since: the rolling state after 16 tokens, reached before the eviction
  // and published when the request ends. No window block, no later state.
  int stored = 0;
  for (const ManagerEvent& e : d.m().TakeEvents()) {
    if (e.kind != KvEvent::Kind::kStored) continue;
    ++stored;
    EXPECT_EQ(e.group, 2) << "block " << e.block;
  }
  EXPECT_EQ(stored, 1);
  // What it computed before the eviction is still hit: 16 tokens, not the 24 it reached.
  d.Add(2, Concat(prompt, out));
  EXPECT_EQ(d.Lookup(2).tokens, 16);
  d.Free(2);
}

TEST(EvictTest, BadCallsChangeNothing) {
  Driver d(MakeConfig({32, 32}, {Full(4, 0), Window(8, 4, 1)}));
  d.Add(1, Seq(10));
  d.Prefill(1);
  const std::vector<int32_t> table = d.Table(1, 0);
  const auto refused = [&](Result<EvictResult> r, StatusCode code, const char* what) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
    EXPECT_EQ(d.Table(1, 0), table);
    d.Check();
  };
  refused(d.m().Evict(9, 0, 1, 0), StatusCode::kNotFound, "9");
  refused(d.m().Evict(1, 1, 1, 0), StatusCode::kInvalidArgument, "window");
  refused(d.m().Evict(1, 2, 1, 0), StatusCode::kInvalidArgument, "out of range");
  refused(d.m().Evict(1, 0, 11, 0), StatusCode::kInvalidArgument,
          "keep 11: expected 0 to the 10 slots");
  refused(d.m().Evict(1, 0, 4, 5), StatusCode::kInvalidArgument,
          "5 unchanged: expected 0 to keep (4)");
  refused(d.m().Evict(1, 0, 4, -1), StatusCode::kInvalidArgument,
          "-1 unchanged: expected 0 to keep (4)");
  refused(d.m().Evict(1, 0, -1, 0), StatusCode::kInvalidArgument,
          "keep -1: expected 0 to the 10 slots");
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{3}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  refused(d.m().Evict(1, 0, 4, 0), StatusCode::kFailedPrecondition, "open step");
  ASSERT_TRUE(d.m().Commit(1, 11).ok());
  // Keeping everything is no eviction: Truncate still works.
  EXPECT_EQ(d.m().Evict(1, 0, 11, 3).value().write_from, 11);
  ASSERT_TRUE(d.m().Truncate(1, 10).ok());
  ASSERT_TRUE(d.m().Evict(1, 0, 5, 0).ok());
  d.Check();
  const Result<TruncateResult> t = d.m().Truncate(1, 8);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("evicted"), std::string::npos);
  d.Check();
  d.Free(1);
}

TEST(EvictTest, ShortOfReplacementsRefusesAndChangesNothing) {
  // Two requests share every block of a 13-token prompt; the pool has one free block but the
  // eviction must replace three shared blocks.
  Driver d(MakeConfig({8}, {Full(4)}));
  const std::vector<int32_t> prompt = Seq(13);
  d.Add(1, prompt);
  d.Prefill(1);
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Add(3, Seq(4, 900));
  d.Prefill(3);
  ASSERT_EQ(d.m().Usage(0).num_free, 2);  // 7 blocks besides the null block
  d.Add(4, Seq(4, 700));
  d.Prefill(4);
  ASSERT_EQ(d.m().Usage(0).num_free, 1);
  const std::vector<int32_t> table = d.Table(1, 0);
  const std::vector<int32_t> order = ManagerProbe::FreeListOrder(d.m(), 0);
  const Result<EvictResult> e = d.m().Evict(1, 0, 10, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("private block"), std::string::npos);
  EXPECT_EQ(d.Table(1, 0), table);
  EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 0), order);
  d.Check();
  // With memory back, the same eviction goes through: every kept block is shared or published,
  // so all three are replaced, and the fourth is released.
  d.Free(3);
  d.Free(4);
  const EvictResult ok = d.m().Evict(1, 0, 10, 0).value();
  EXPECT_EQ(ok.blocks_replaced, 3);
  EXPECT_EQ(ok.blocks_released, 1);
  d.Check();
  d.Free(1);
  d.Free(2);
}

TEST(EvictTest, ForkAfterEvictionSharesTheCompactedBlocks) {
  Driver d(MakeConfig({32}, {Full(4)}));
  d.Add(1, Seq(18));
  d.Prefill(1);
  ASSERT_TRUE(d.m().Evict(1, 0, 9, 4).ok());
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Check();
  EXPECT_EQ(d.Table(1, 0), d.Table(2, 0));
  d.Decode(1, 5);  // slot 9: block 2 holds slot 8, shared with the child: copied first
  d.Decode(2, 6);
  d.Check();
  EXPECT_NE(d.Table(1, 0)[2], d.Table(2, 0)[2]);
  EXPECT_EQ(d.Table(1, 0)[0], d.Table(2, 0)[0]);
  d.Free(1);
  d.Free(2);
}

}  // namespace
}  // namespace hkv::testing
