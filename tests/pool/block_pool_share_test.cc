// BlockPool with a branch bonus: blocks of a prefix several continuations share queue behind the
// blocks freed after them, by their share level, until the clock passes the bonus; counts and
// levels belong to the identity.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

#include "pool_test_util.h"

namespace hkv {
namespace {

using pool_testing::ExpectValid;
using pool_testing::Key;

// Allocates one block, publishes it under Key(key); returns it held.
int32_t Cached(BlockPool& p, uint64_t key) {
  std::vector<int32_t> got;
  EXPECT_TRUE(p.Allocate(1, got).ok());
  EXPECT_TRUE(p.Publish(got[0], Key(key)).ok());
  return got[0];
}

void FreeOne(BlockPool& p, int32_t b) {
  ASSERT_TRUE(p.Free(std::vector<int32_t>{b}).ok());
}

// The tail of the free list: the blocks after the first `skip` (fresh ones, queued at the head).
std::vector<int32_t> Queued(const BlockPool& p, size_t skip) {
  const std::vector<int32_t> order = p.FreeListOrder();
  return {order.begin() + static_cast<std::ptrdiff_t>(std::min(skip, order.size())), order.end()};
}

TEST(BlockPoolShare, ASharedBlockQueuesBehindBlocksFreedAfterItUntilItsBonusRunsOut) {
  BlockPool p = BlockPool::Create(12).value();
  ASSERT_TRUE(p.set_branch_bonus(3, 8).ok());
  const int32_t shared = Cached(p, 1);
  EXPECT_EQ(p.AddContinuation(shared, 10).value(), 1);
  EXPECT_EQ(p.AddContinuation(shared, 20).value(), 2);
  ASSERT_TRUE(p.MarkShared(shared, 2).ok());
  EXPECT_EQ(p.share_level(shared), 2);
  FreeOne(p, shared);  // queued 3 ticks ahead of its time
  std::vector<int32_t> plain;
  for (uint64_t k = 2; k <= 5; ++k) {
    plain.push_back(Cached(p, k));
    FreeOne(p, plain.back());
    ExpectValid(p);
  }
  // Freed after it: the first two go ahead, the third ties its tick (ties in the order freed:
  // the shared one was first), and the fourth is past its bonus.
  EXPECT_EQ(Queued(p, 6), (std::vector<int32_t>{plain[0], plain[1], shared, plain[2], plain[3]}));
  // Eviction takes them in that order.
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(8, got).ok());
  EXPECT_EQ(p.Find(Key(2)), -1);
  EXPECT_EQ(p.Find(Key(3)), -1);
  EXPECT_EQ(p.Find(Key(1)), shared);
  ExpectValid(p);
}

TEST(BlockPoolShare, TheLevelSetsTheBonusUpToItsCap) {
  BlockPool p = BlockPool::Create(16).value();
  ASSERT_TRUE(p.set_branch_bonus(2, 2).ok());
  const int32_t two = Cached(p, 1), many = Cached(p, 2);
  ASSERT_TRUE(p.MarkShared(two, 2).ok());    // one level: 2 ticks
  ASSERT_TRUE(p.MarkShared(many, 40).ok());  // capped at 2 levels: 4 ticks
  ASSERT_TRUE(p.MarkShared(many, 3).ok());   // a level never goes down
  EXPECT_EQ(p.share_level(many), 40);
  FreeOne(p, many);
  FreeOne(p, two);
  std::vector<int32_t> plain;
  for (uint64_t k = 3; k <= 7; ++k) {
    plain.push_back(Cached(p, k));
    FreeOne(p, plain.back());
  }
  // many: freed at tick 1, queued at 5; two: freed at 2, queued at 4; plain at 3, 4, ..., 7.
  EXPECT_EQ(Queued(p, 8),
            (std::vector<int32_t>{plain[0], two, plain[1], many, plain[2], plain[3], plain[4]}));
  ExpectValid(p);
}

// Two-level memory: the arena gives up the segment that emptied first. One that queues a shared
// block is as young as that block's bonus; demoting a block does not make a segment older.
TEST(BlockPoolShare, AnEmptySegmentIsAsYoungAsTheBonusItQueues) {
  auto clock = std::make_shared<uint64_t>(0);
  BlockPool p = BlockPool::CreateSegmented(2, 2, clock).value();
  ASSERT_TRUE(p.set_branch_bonus(10, 8).ok());
  for (int32_t s = 0; s < 2; ++s)
    ASSERT_TRUE(p.AddSegment(s).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(4, got).ok());
  std::sort(got.begin(), got.end());
  for (int32_t b = 1; b <= 4; ++b)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.MarkShared(1, 2).ok());
  // Segment 0 (blocks 1, 2) empties first, at tick 2, but block 1 queues at 1 + 10.
  ASSERT_TRUE(p.Free(std::vector<int32_t>{1, 2}).ok());
  EXPECT_EQ(p.empty_since(0), 11u);
  ASSERT_TRUE(p.Free(std::vector<int32_t>{3, 4}).ok());
  EXPECT_EQ(p.empty_since(1), 4u);
  EXPECT_EQ(p.OldestEmptyCached(), 1);
  EXPECT_EQ(p.NextEmptySegment(1), 0);
  // Demoted, block 4 goes ahead of every queued block; its segment keeps its age.
  ASSERT_TRUE(p.Demote(4).ok());
  EXPECT_EQ(p.empty_since(1), 4u);
  ExpectValid(p);
}

TEST(BlockPoolShare, TheSameChildPublishedAgainIsNotASecondContinuation) {
  BlockPool p = BlockPool::Create(8).value();
  ASSERT_TRUE(p.set_branch_bonus(4, 8).ok());
  const int32_t parent = Cached(p, 1);
  EXPECT_EQ(p.AddContinuation(parent, 77).value(), 1);
  EXPECT_EQ(p.AddContinuation(parent, 77).value(), 1);  // evicted and computed again
  EXPECT_EQ(p.AddContinuation(parent, 78).value(), 2);
  EXPECT_EQ(p.continuations(parent), 2);
  EXPECT_EQ(p.share_level(parent), 0);  // counting marks nothing: the caller decides
}

TEST(BlockPoolShare, CountsAndLevelsBelongToTheIdentity) {
  BlockPool p = BlockPool::Create(4).value();
  ASSERT_TRUE(p.set_branch_bonus(4, 8).ok());
  const int32_t b = Cached(p, 1);
  ASSERT_TRUE(p.AddContinuation(b, 5).ok());
  ASSERT_TRUE(p.MarkShared(b, 3).ok());
  // Moved by compaction: the key takes its counts along.
  std::vector<int32_t> spare;
  ASSERT_TRUE(p.Allocate(1, spare).ok());
  FreeOne(p, spare[0]);
  ASSERT_TRUE(p.MoveHeld(b, spare[0]).ok());
  EXPECT_EQ(p.Find(Key(1)), spare[0]);
  EXPECT_EQ(p.share_level(spare[0]), 3);
  EXPECT_EQ(p.continuations(spare[0]), 1);
  EXPECT_EQ(p.share_level(b), 0);
  ExpectValid(p);
  // Evicted: the block that takes its place starts from nothing.
  FreeOne(p, spare[0]);
  std::vector<int32_t> all;
  ASSERT_TRUE(p.Allocate(3, all).ok());
  ASSERT_NE(std::find(all.begin(), all.end(), spare[0]), all.end());
  EXPECT_EQ(p.Find(Key(1)), -1);
  ASSERT_TRUE(p.Publish(spare[0], Key(9)).ok());
  EXPECT_EQ(p.share_level(spare[0]), 0);
  EXPECT_EQ(p.continuations(spare[0]), 0);
  ExpectValid(p);
  // A reset drops every count with every identity.
  ASSERT_TRUE(p.MarkShared(spare[0], 2).ok());
  p.ResetPrefixCache();
  EXPECT_EQ(p.share_level(spare[0]), 0);
  ExpectValid(p);
}

// After a reset nothing the pool holds is worth anything: blocks queued with a bonus ahead of the
// clock go before a block cached after the reset, not behind it.
TEST(BlockPoolShare, AResetQueuesEveryFreeBlockAsWorthless) {
  BlockPool p = BlockPool::Create(5).value();
  ASSERT_TRUE(p.set_branch_bonus(10, 8).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(4, got).ok());
  for (int32_t b : got)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.MarkShared(got[0], 2).ok());
  ASSERT_TRUE(p.MarkShared(got[1], 2).ok());
  ASSERT_TRUE(p.Free(got).ok());  // two queued ahead of the clock, two at it
  p.ResetPrefixCache();
  ExpectValid(p);
  std::vector<int32_t> one;
  ASSERT_TRUE(p.Allocate(1, one).ok());
  ASSERT_TRUE(p.Publish(one[0], Key(99)).ok());
  FreeOne(p, one[0]);
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder().back(), one[0]);  // evicted last
  std::vector<int32_t> rest;
  ASSERT_TRUE(p.Allocate(3, rest).ok());  // the three worthless ones
  EXPECT_EQ(p.Find(Key(99)), one[0]);
  // The bonus may be set again on an emptied cache.
  FreeOne(p, rest[0]);
  p.ResetPrefixCache();
  ASSERT_TRUE(p.set_branch_bonus(4, 8).ok());
  ExpectValid(p);
}

TEST(BlockPoolShare, BadCallsAreRejectedAndChangeNothing) {
  BlockPool p = BlockPool::Create(6).value();
  EXPECT_EQ(p.set_branch_bonus(4, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.set_branch_bonus(4, 255).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.branch_bonus_ticks(), 0u);
  ASSERT_TRUE(p.set_branch_bonus(4, 8).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(1, got).ok());
  // Only a cached block counts continuations or takes a level.
  EXPECT_EQ(p.AddContinuation(got[0], 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.MarkShared(got[0], 2).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.MarkShared(0, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.AddContinuation(99, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.share_level(got[0]), 0);
  ASSERT_TRUE(p.Publish(got[0], Key(1)).ok());
  // Set once, before anything is cached: the free list must be in one order throughout.
  const Status late = p.set_branch_bonus(8, 8);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("already caches 1 block"), std::string::npos);
  EXPECT_EQ(p.branch_bonus_ticks(), 4u);
  // Never with an eviction rank, which orders every cached block itself.
  struct OneRank final : EvictionRank {
    uint64_t Rank(const BlockHash&) const override { return 1; }
  } rank;
  EXPECT_EQ(p.set_eviction_rank(&rank).code(), StatusCode::kFailedPrecondition);
  BlockPool ranked = BlockPool::Create(4).value();
  ASSERT_TRUE(ranked.set_eviction_rank(&rank).ok());
  EXPECT_EQ(ranked.set_branch_bonus(4, 8).code(), StatusCode::kFailedPrecondition);
  ExpectValid(p);
}

// Every call a manager makes, at random, with shared blocks freed among plain ones: the free
// list stays sorted by tick and the place plain blocks queue at stays on it (CheckInvariants).
TEST(BlockPoolShare, RandomCallsKeepTheListSorted) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);  // result_type is 32 bits wide
    const auto next = [&] { return static_cast<uint32_t>(rng()); };
    BlockPool p = BlockPool::Create(40).value();
    ASSERT_TRUE(p.set_branch_bonus(5, 3).ok());
    std::vector<int32_t> held;
    uint64_t next_key = 1;
    for (int op = 0; op < 3000; ++op) {
      const uint32_t r = next() % 10;
      if (r < 3 && p.num_free() > 0) {
        std::vector<int32_t> got;
        ASSERT_TRUE(p.Allocate(1, got).ok());
        if (next() % 4 != 0) {
          ASSERT_TRUE(p.Publish(got[0], Key(next_key++)).ok());
        }
        held.push_back(got[0]);
      } else if (r < 6 && !held.empty()) {
        const size_t i = next() % held.size();
        const int32_t b = held[i];
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        if (p.has_identity(b) && next() % 2 == 0) {
          ASSERT_TRUE(p.AddContinuation(b, next()).ok());
          ASSERT_TRUE(p.MarkShared(b, static_cast<int32_t>(next() % 6)).ok());
        }
        ASSERT_TRUE(
            p.Free(std::vector<int32_t>{b}, next() % 8 == 0 ? Retention::kLow : Retention::kNormal)
                .ok());
      } else if (r < 8) {
        // A hit: a free cached block taken back (a random one of the list).
        const std::vector<int32_t> order = p.FreeListOrder();
        if (order.empty()) continue;
        const int32_t b = order[next() % order.size()];
        if (p.has_identity(b)) {
          ASSERT_TRUE(p.Acquire(b).ok());
          held.push_back(b);
        }
      } else if (r < 9) {
        const std::vector<int32_t> order = p.FreeListOrder();
        if (!order.empty()) {
          ASSERT_TRUE(p.Demote(order[next() % order.size()]).ok());
        }
      } else if (!held.empty() && p.num_free() > 0) {
        const std::vector<int32_t> order = p.FreeListOrder();
        const int32_t dst = order[next() % order.size()];
        const size_t i = next() % held.size();
        if (p.ref_count(held[i]) == 1) {
          ASSERT_TRUE(p.MoveHeld(held[i], dst).ok());
          held[i] = dst;
        }
      }
      const Status s = p.CheckInvariants();
      ASSERT_TRUE(s.ok()) << "seed " << seed << " op " << op << ": " << s.message();
    }
  }
}

}  // namespace
}  // namespace hkv
