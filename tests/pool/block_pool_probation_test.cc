// Retention::kProbation: freed cached blocks queue as demoted ones do - after the blocks worth
// nothing, ahead of every block freed normally, still serving hits - in the order listed; blocks a
// branch bonus keeps still go to the tail; and a segment emptied onto probation is the first the
// arena may take.
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

#include "pool_test_util.h"

namespace hkv {
namespace {

using pool_testing::ExpectValid;
using pool_testing::Key;

TEST(BlockPoolProbation, QueuesAheadOfNormalBlocksInTheOrderListed) {
  BlockPool p = BlockPool::Create(8).value();
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(6, got).ok());
  for (int32_t b = 1; b <= 5; ++b)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{1, 2}).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{6}, Retention::kLow).ok());
  EXPECT_EQ(p.num_queued_cached(), 2);
  // A request's blocks, tail first: the tail is evicted first, as it would be at the tail. Each
  // cached block freed advances the clock, on probation as at the tail.
  const uint64_t clock = p.clock();
  ASSERT_TRUE(p.Free(std::vector<int32_t>{5, 4, 3}, Retention::kProbation).ok());
  EXPECT_EQ(p.clock(), clock + 3);
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{6, 7, 5, 4, 3, 1, 2}));
  EXPECT_EQ(p.num_free_cached(), 5);
  EXPECT_EQ(p.num_queued_cached(), 2);  // probation is not recency's queue
  for (int32_t b = 1; b <= 5; ++b)
    EXPECT_EQ(p.Find(Key(static_cast<uint64_t>(b))), b);
  std::vector<int32_t> three;
  ASSERT_TRUE(p.Allocate(3, three).ok());
  EXPECT_EQ(three, (std::vector<int32_t>{6, 7, 5}));
  EXPECT_EQ(p.Find(Key(5)), -1);
  EXPECT_EQ(p.Find(Key(4)), 4);
  EXPECT_EQ(p.Find(Key(1)), 1);
  ExpectValid(p);
  // A later chain on probation goes behind the earlier one, and blocks without identity before
  // both.
  std::vector<int32_t> more;
  ASSERT_TRUE(p.Allocate(2, more).ok());  // 4 and 3: evicted
  ASSERT_TRUE(p.Publish(more[0], Key(40)).ok());
  ASSERT_TRUE(p.Free(three, Retention::kNormal).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{more[1], more[0]}, Retention::kProbation).ok());
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{more[1], more[0], 1, 2, 6, 7, 5}));
}

TEST(BlockPoolProbation, ABlockABonusKeepsStaysAtTheTail) {
  BlockPool p = BlockPool::Create(6).value();
  ASSERT_TRUE(p.set_branch_bonus(100, 8).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  for (int32_t b : got)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.MarkShared(got[0], 2).ok());  // a system prompt's block
  ASSERT_TRUE(p.Free(std::vector<int32_t>{got[2], got[1], got[0]}, Retention::kProbation).ok());
  ExpectValid(p);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{4, 5, got[2], got[1], got[0]}));
  EXPECT_EQ(p.num_queued_cached(), 1);
}

// One block per segment (a recurrent state per slab): a state freed onto probation leaves its slab
// first in line for another class, ahead of slabs that emptied earlier with normal retention.
TEST(BlockPoolProbation, AnEmptySegmentOnProbationSortsFirst) {
  BlockPool p = BlockPool::CreateSegmented(3, 1, std::make_shared<uint64_t>(0)).value();
  for (int32_t s = 0; s < 3; ++s)
    ASSERT_TRUE(p.AddSegment(s).ok());
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  for (int32_t b : got)
    ASSERT_TRUE(p.Publish(b, Key(static_cast<uint64_t>(b))).ok());
  ASSERT_TRUE(p.Free({&got[0], 1}).ok());
  ASSERT_TRUE(p.Free({&got[1], 1}).ok());
  ASSERT_TRUE(p.Free({&got[2], 1}, Retention::kProbation).ok());
  ExpectValid(p);
  EXPECT_EQ(p.OldestEmptyCached(), p.segment_of(got[2]));
  EXPECT_EQ(p.empty_since(p.segment_of(got[2])), 0u);
  EXPECT_EQ(p.NextEmptySegment(p.segment_of(got[2])), p.segment_of(got[0]));
}

// Random allocations, hits, publications and frees of all three retentions against a list model:
// the head run (blocks queued at the head or on probation) and the rest, in order.
TEST(BlockPoolProbation, RandomOperationsMatchAListModel) {
  for (uint32_t seed : {21u, 22u, 23u}) {
    constexpr int32_t kBlocks = 48;
    BlockPool p = BlockPool::Create(kBlocks).value();
    std::mt19937 rng(seed);
    std::vector<int32_t> refs(kBlocks, 0), order, held;
    for (int32_t b = 1; b < kBlocks; ++b)
      order.push_back(b);
    size_t run = order.size();  // leading entries of the head run
    std::map<uint64_t, int32_t> block_of;
    std::map<int32_t, uint64_t> key_of;
    const auto take = [&](int32_t b) {
      const auto at = std::find(order.begin(), order.end(), b);
      if (static_cast<size_t>(at - order.begin()) < run) --run;
      order.erase(at);
    };
    for (int op = 0; op < 6000; ++op) {
      const uint32_t kind = rng() % 4;
      if (kind == 0) {
        const auto n = static_cast<int32_t>(rng() % 5);
        std::vector<int32_t> got;
        if (!p.Allocate(n, got).ok()) {
          ASSERT_GT(n, static_cast<int32_t>(order.size()));
          continue;
        }
        ASSERT_EQ(got, std::vector<int32_t>(order.begin(), order.begin() + n));
        for (int32_t b : got) {
          take(b);
          if (key_of.count(b)) {
            block_of.erase(key_of[b]);
            key_of.erase(b);
          }
          refs[static_cast<size_t>(b)] = 1;
          held.push_back(b);
        }
      } else if (kind == 1 && !held.empty()) {
        const int32_t b = held[rng() % held.size()];
        const uint64_t k = rng() % 30;
        if (!key_of.count(b) && !block_of.count(k)) {
          ASSERT_TRUE(p.Publish(b, Key(k)).ok());
          block_of[k] = b;
          key_of[b] = k;
        }
      } else if (kind == 2) {
        const uint64_t k = rng() % 30;
        const int32_t found = p.Find(Key(k));
        ASSERT_EQ(found, block_of.count(k) ? block_of[k] : -1);
        if (found < 0) continue;
        ASSERT_TRUE(p.Acquire(found).ok());
        if (refs[static_cast<size_t>(found)]++ == 0) take(found);
        held.push_back(found);
      } else if (!held.empty()) {
        std::shuffle(held.begin(), held.end(), rng);
        const size_t n = 1 + rng() % std::min<size_t>(held.size(), 4);
        const std::vector<int32_t> victims(held.end() - static_cast<long>(n), held.end());
        held.resize(held.size() - n);
        const auto retention = static_cast<Retention>(rng() % 3);
        ASSERT_TRUE(p.Free(victims, retention).ok());
        // kLow walks the list from its end (prepending keeps the listed order), so a block listed
        // twice becomes free at its first listing; the others walk it from the front.
        std::vector<int32_t> freed;
        if (retention == Retention::kLow) {
          for (auto it = victims.rbegin(); it != victims.rend(); ++it) {
            if (--refs[static_cast<size_t>(*it)] == 0) freed.insert(freed.begin(), *it);
          }
        } else {
          for (int32_t b : victims) {
            if (--refs[static_cast<size_t>(b)] == 0) freed.push_back(b);
          }
        }
        if (retention == Retention::kNormal) {
          order.insert(order.end(), freed.begin(), freed.end());
        } else if (retention == Retention::kLow) {
          order.insert(order.begin(), freed.begin(), freed.end());
          run += freed.size();
        } else {
          for (int32_t b : freed) {
            if (!key_of.count(b)) continue;
            order.insert(order.begin() + static_cast<long>(run), b);
            ++run;
          }
          for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
            if (key_of.count(*it)) continue;
            order.insert(order.begin(), *it);
            ++run;
          }
        }
      }
      const Status check = p.CheckInvariants(refs);
      ASSERT_TRUE(check.ok()) << "seed " << seed << " op " << op << ": " << check.message();
      ASSERT_EQ(p.FreeListOrder(), order) << "seed " << seed << " op " << op;
    }
  }
}

}  // namespace
}  // namespace hkv
