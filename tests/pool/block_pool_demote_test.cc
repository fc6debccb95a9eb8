// BlockPool::Demote: a free block keeps its identity but queues behind the blocks worth nothing
// and ahead of every block of normal retention, at both levels of two-level memory.
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

#include "pool_test_util.h"

namespace hkv {
namespace {

using pool_testing::ExpectValid;
using pool_testing::Key;

TEST(BlockPoolDemote, QueuesAfterWorthlessBlocksAndBeforeNormalOnes) {
  BlockPool p = BlockPool::Create(8).value();
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(4, got).ok());
  ASSERT_EQ(got, (std::vector<int32_t>{1, 2, 3, 4}));
  for (int32_t b : {1, 2, 3})
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  const std::vector<int32_t> cached{1, 2, 3}, plain{4};
  ASSERT_TRUE(p.Free(cached).ok());
  ASSERT_TRUE(p.Free(plain, Retention::kLow).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{4, 5, 6, 7, 1, 2, 3}));
  ASSERT_TRUE(p.Demote(3).ok());
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{4, 5, 6, 7, 3, 1, 2}));
  // A second demotion queues behind the first: demoted blocks go oldest-demoted first.
  ASSERT_TRUE(p.Demote(2).ok());
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{4, 5, 6, 7, 3, 2, 1}));
  // Worthless blocks freed later still go before them.
  std::vector<int32_t> one;
  ASSERT_TRUE(p.Allocate(1, one).ok());
  ASSERT_TRUE(p.Free(one, Retention::kLow).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{4, 5, 6, 7, 3, 2, 1}));
  // Demoted blocks still serve hits until reused.
  EXPECT_EQ(p.Find(Key(3)), 3);
  EXPECT_EQ(p.Find(Key(2)), 2);
  std::vector<int32_t> five;
  ASSERT_TRUE(p.Allocate(5, five).ok());
  EXPECT_EQ(p.Find(Key(3)), -1);  // evicted before the normal ones
  EXPECT_EQ(p.Find(Key(2)), 2);
  EXPECT_EQ(p.Find(Key(1)), 1);
  ExpectValid(p);
}

TEST(BlockPoolDemote, BadCallsAreRejectedAndChangeNothing) {
  BlockPool p = BlockPool::Create(6).value();
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(2, got).ok());
  const std::vector<int32_t> before = p.FreeListOrder();
  EXPECT_EQ(p.Demote(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Demote(6).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Demote(-1).code(), StatusCode::kInvalidArgument);
  const Status held = p.Demote(got[0]);
  EXPECT_EQ(held.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(held.message().find("held"), std::string::npos) << held.message();
  EXPECT_EQ(p.FreeListOrder(), before);
  EXPECT_EQ(p.ref_count(got[0]), 1);
  ExpectValid(p);

  BlockPool s = BlockPool::CreateSegmented(2, 2, std::make_shared<uint64_t>(0)).value();
  const Status dormant = s.Demote(1);  // its segment is not owned
  EXPECT_EQ(dormant.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(dormant.message().find("not owned"), std::string::npos) << dormant.message();
  ExpectValid(s);
}

// With one block per segment (a recurrent state per slab), demoting the block also makes its
// segment the first that the arena gives to another class, ahead of segments that emptied
// earlier.
TEST(BlockPoolDemote, AnEmptySegmentOfDemotedBlocksSortsFirst) {
  BlockPool p = BlockPool::CreateSegmented(3, 1, std::make_shared<uint64_t>(0)).value();
  for (int32_t s = 0; s < 3; ++s)
    ASSERT_TRUE(p.AddSegment(s).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  for (int32_t b : got) {
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
    ASSERT_TRUE(p.Free({&b, 1}).ok());
  }
  ExpectValid(p);
  EXPECT_EQ(p.OldestEmptyCached(), p.segment_of(got[0]));
  ASSERT_TRUE(p.Demote(got[2]).ok());
  ExpectValid(p);
  EXPECT_EQ(p.OldestEmptyCached(), p.segment_of(got[2]));
  EXPECT_EQ(p.empty_since(p.segment_of(got[2])), 0u);
  EXPECT_EQ(p.NextEmptySegment(p.segment_of(got[2])), p.segment_of(got[0]));

  // A multi-block segment still holding a block of normal retention keeps its age.
  BlockPool q = BlockPool::CreateSegmented(2, 2, std::make_shared<uint64_t>(0)).value();
  ASSERT_TRUE(q.AddSegment(0).ok());
  ASSERT_TRUE(q.AddSegment(1).ok());
  std::vector<int32_t> all;
  ASSERT_TRUE(q.Allocate(4, all).ok());
  for (int32_t b : all)
    ASSERT_TRUE(q.Publish(b, Key(static_cast<uint64_t>(b) + 10)).ok());
  ASSERT_TRUE(q.Free(all).ok());
  const int32_t seg = q.segment_of(all[3]);
  const uint64_t age = q.empty_since(seg);
  ASSERT_TRUE(q.Demote(all[3]).ok());
  ExpectValid(q);
  EXPECT_EQ(q.empty_since(seg), age);
  EXPECT_NE(q.OldestEmptyCached(), seg);
}

// Packing: blocks worth nothing (demoted here) are interchangeable, so a packing pool takes them
// one segment at a time, leaving the other segments without a held block; a plain pool takes
// them in free-list order, one in every segment. Blocks that are worth something are still taken
// in eviction order.
TEST(BlockPoolDemote, PackingTakesWorthlessBlocksOneSegmentAtATime) {
  const auto run = [](bool pack, std::vector<int32_t>& got) {
    BlockPool p = BlockPool::CreateSegmented(3, 4, std::make_shared<uint64_t>(0)).value();
    p.set_pack_segments(pack);
    for (int32_t s = 0; s < 3; ++s)
      EXPECT_TRUE(p.AddSegment(s).ok());
    std::vector<int32_t> all;
    EXPECT_TRUE(p.Allocate(12, all).ok());
    for (int32_t b : all)
      EXPECT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b) + 100)).ok());
    // Freed and demoted interleaved over the segments: 1, 5, 9, 2, 6, 10, ...
    for (int32_t k = 0; k < 4; ++k) {
      for (int32_t s = 0; s < 3; ++s) {
        const int32_t b = s * 4 + k + 1;
        EXPECT_TRUE(p.Free({&b, 1}).ok());
        EXPECT_TRUE(p.Demote(b).ok());
      }
    }
    ExpectValid(p);
    EXPECT_TRUE(p.Allocate(4, got).ok());
    ExpectValid(p);
    return p.num_empty_segments();
  };
  std::vector<int32_t> packed, plain;
  EXPECT_EQ(run(true, packed), 2);
  EXPECT_EQ(run(false, plain), 0);
  EXPECT_EQ(packed, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(plain, (std::vector<int32_t>{1, 5, 9, 2}));

  // Blocks freed with normal retention keep their eviction order, packing or not.
  BlockPool q = BlockPool::CreateSegmented(2, 2, std::make_shared<uint64_t>(0)).value();
  q.set_pack_segments(true);
  ASSERT_TRUE(q.AddSegment(0).ok());
  ASSERT_TRUE(q.AddSegment(1).ok());
  std::vector<int32_t> all, again;
  ASSERT_TRUE(q.Allocate(4, all).ok());
  for (int32_t b : all)
    ASSERT_TRUE(q.Publish(b, Key(static_cast<uint64_t>(b) + 200)).ok());
  const std::vector<int32_t> order = {1, 3, 2, 4};
  ASSERT_TRUE(q.Free(order).ok());
  ASSERT_TRUE(q.Allocate(2, again).ok());
  EXPECT_EQ(again, (std::vector<int32_t>{1, 3}));
  ExpectValid(q);
}

}  // namespace
}  // namespace hkv
