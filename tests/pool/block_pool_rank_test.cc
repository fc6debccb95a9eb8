// BlockPool with an eviction rank: cached blocks freed to the tail queue by rank, not by time;
// Rerank requeues; an empty segment is as valuable as the best block it caches.
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

#include "pool_test_util.h"

namespace hkv {
namespace {

using pool_testing::ExpectValid;
using pool_testing::Key;

// Ranks set by the test, per digest (absent: 1).
class TableRank final : public EvictionRank {
 public:
  uint64_t Rank(const BlockHash& d) const override {
    const auto it = ranks.find(d.lo);
    return it == ranks.end() ? 1 : it->second;
  }
  std::unordered_map<uint64_t, uint64_t> ranks;
};

// Allocates n blocks, publishes block i under Key(keys[i]) and frees them in that order.
std::vector<int32_t> CacheAndFree(BlockPool& p, const std::vector<uint64_t>& keys) {
  std::vector<int32_t> got;
  EXPECT_TRUE(p.Allocate(static_cast<int32_t>(keys.size()), got).ok());
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_TRUE(p.Publish(got[i], Key(keys[i])).ok());
  EXPECT_TRUE(p.Free(got).ok());
  return got;
}

TEST(BlockPoolRank, CachedBlocksQueueByRankWhateverTheOrderFreed) {
  TableRank rank;
  rank.ranks = {{10, 50}, {11, 20}, {12, 70}, {13, 20}};
  BlockPool p = BlockPool::Create(7).value();
  ASSERT_TRUE(p.set_eviction_rank(&rank).ok());
  const std::vector<int32_t> b = CacheAndFree(p, {10, 11, 12, 13});
  ExpectValid(p);
  // Two fresh blocks first (worth nothing), then ranks 20, 20 (in the order freed), 50, 70.
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{5, 6, b[1], b[3], b[0], b[2]}));
  // A block without identity freed to the tail ranks lowest among the ranked ones.
  std::vector<int32_t> plain;
  ASSERT_TRUE(p.Allocate(3, plain).ok());  // 5, 6 and the first rank-20 block (evicted)
  EXPECT_EQ(p.Find(Key(11)), -1);
  ASSERT_TRUE(p.Free(std::vector<int32_t>{plain[2]}).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{plain[2], b[3], b[0], b[2]}));
  ExpectValid(p);
  // Allocation now evicts by rank: the rank-20 block, then 50; 70 survives.
  std::vector<int32_t> more;
  ASSERT_TRUE(p.Allocate(3, more).ok());
  EXPECT_EQ(p.Find(Key(13)), -1);
  EXPECT_EQ(p.Find(Key(10)), -1);
  EXPECT_EQ(p.Find(Key(12)), b[2]);
  ExpectValid(p);
}

TEST(BlockPoolRank, RerankRequeuesAFreeBlockByItsNewRank) {
  TableRank rank;
  rank.ranks = {{1, 10}, {2, 20}, {3, 30}};
  BlockPool p = BlockPool::Create(4).value();
  ASSERT_TRUE(p.set_eviction_rank(&rank).ok());
  const std::vector<int32_t> b = CacheAndFree(p, {1, 2, 3});
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[0], b[1], b[2]}));
  rank.ranks[3] = 5;
  // Until told, the pool keeps the order it queued by.
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[0], b[1], b[2]}));
  ASSERT_TRUE(p.Rerank(b[2]).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[2], b[0], b[1]}));
  rank.ranks[1] = 25;
  ASSERT_TRUE(p.Rerank(b[0]).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[2], b[1], b[0]}));
  ExpectValid(p);
  // A held block has nothing to requeue; it is ranked when freed.
  ASSERT_TRUE(p.Acquire(b[1]).ok());
  rank.ranks[2] = 100;
  ASSERT_TRUE(p.Rerank(b[1]).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{b[1]}).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[2], b[0], b[1]}));
  // A demoted block stays among the worthless ones, whatever its rank.
  ASSERT_TRUE(p.Demote(b[1]).ok());
  ASSERT_TRUE(p.Rerank(b[1]).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{b[1], b[2], b[0]}));
  ExpectValid(p);
}

TEST(BlockPoolRank, BadCallsAreRejectedAndChangeNothing) {
  TableRank rank;
  BlockPool lru = BlockPool::Create(4).value();
  const std::vector<int32_t> b = CacheAndFree(lru, {1, 2});
  // The free list is in one order throughout: a rank comes before anything is cached.
  const Status late = lru.set_eviction_rank(&rank);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("already caches 2"), std::string::npos) << late.message();
  const Status none = lru.Rerank(b[0]);
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("no eviction rank"), std::string::npos) << none.message();
  BlockPool p = BlockPool::Create(4).value();
  ASSERT_TRUE(p.set_eviction_rank(&rank).ok());
  EXPECT_EQ(p.Rerank(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Rerank(4).code(), StatusCode::kInvalidArgument);
  ExpectValid(p);
  ExpectValid(lru);
}

TEST(BlockPoolRank, AnEmptySegmentIsWorthTheBestBlockItCaches) {
  TableRank rank;
  auto clock = std::make_shared<uint64_t>(0);
  BlockPool p = BlockPool::CreateSegmented(3, 2, clock).value();
  ASSERT_TRUE(p.set_eviction_rank(&rank).ok());
  for (int32_t s = 0; s < 3; ++s)
    ASSERT_TRUE(p.AddSegment(s).ok());
  rank.ranks = {{1, 40}, {2, 10}, {3, 20}, {4, 30}, {5, 5}, {6, 6}};
  // Segment 0 caches ranks 40 and 10, segment 1 20 and 30, segment 2 5 and 6.
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(6, got).ok());
  std::sort(got.begin(), got.end());
  for (int32_t b = 1; b <= 6; ++b)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.Free(got).ok());
  ExpectValid(p);
  // The empty cached segments sort by the best rank each caches: 6, 30, 40.
  EXPECT_EQ(p.OldestEmptyCached(), 2);
  EXPECT_EQ(p.empty_since(2), 6u);
  EXPECT_EQ(p.NextEmptySegment(2), 1);
  EXPECT_EQ(p.NextEmptySegment(1), 0);
  EXPECT_EQ(p.empty_since(0), 40u);
  // Segment 0's best block loses its worth: the segment is now worth its other block, 10.
  rank.ranks[1] = 1;
  ASSERT_TRUE(p.Rerank(1).ok());
  EXPECT_EQ(p.empty_since(0), 10u);
  EXPECT_EQ(p.OldestEmptyCached(), 2);
  EXPECT_EQ(p.NextEmptySegment(2), 0);
  EXPECT_EQ(p.NextEmptySegment(0), 1);
  ExpectValid(p);
  // Demoting segment 2's best block leaves it worth the other one.
  ASSERT_TRUE(p.Demote(6).ok());
  EXPECT_EQ(p.empty_since(2), 5u);
  ExpectValid(p);
}

}  // namespace
}  // namespace hkv
