// Eviction order, lazy eviction, retention, lookahead and all-or-nothing allocation.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

std::vector<int32_t> Reversed(std::vector<int32_t> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

TEST(Eviction, LruAcrossRequestsAndTailFirstWithinOne) {
  Driver d(MakeConfig({32}, {Full(4)}));
  d.Add(1, Seq(12, 100));
  d.Prefill(1);
  d.Add(2, Seq(12, 500));
  d.Prefill(2);
  const auto a = d.Table(1, 0), b = d.Table(2, 0);
  d.Free(1);
  d.Free(2);
  const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  ASSERT_EQ(order.size(), 31u);
  // Request 1 went first, so its blocks are evicted first; within each request the tail goes
  // first, so a long shared prefix survives longest.
  std::vector<int32_t> tail(order.end() - 6, order.end());
  EXPECT_EQ(tail, Concat(Reversed(a), Reversed(b)));
}

// A request that computes blocks already cached (here it skipped the hit; on a recurrent model
// it must when the state at the end of the cached KV is gone) takes their keys over once it has
// computed them: the cached copies, older, would otherwise be evicted before anything freed since
// and the prefix would lose them, while the request's own copies went back without identity. The
// old copies go to the head, worth nothing.
TEST(Eviction, ARecomputedPrefixKeepsItsKeysOnTheNewerCopies) {
  for (const bool ahead : {false, true}) {
    SCOPED_TRACE(ahead ? "published at Allocate" : "published at Commit");
    ManagerConfig c = MakeConfig({16}, {Full(4)});
    c.record_events = true;
    c.publish_at_allocate = ahead;
    Driver d(c);
    d.Add(1, Seq(13, 100));  // P: three full blocks and a partial one
    d.Prefill(1);
    const auto old = d.Table(1, 0);
    d.Free(1);
    d.Add(2, Seq(12, 500));  // Q, freed after P
    d.Prefill(2);
    d.Free(2);
    (void)d.m().TakeEvents();
    d.Add(3, Seq(13, 100));
    EXPECT_EQ(d.Lookup(3).tokens, 12);
    d.Run(3, 13);  // computes P again instead of hitting it
    const auto fresh = d.Table(3, 0);
    const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_NE(fresh[j], old[j]);
      // The old copy caches nothing now and waits at the head of the free list.
      EXPECT_LT(std::find(order.begin(), order.end(), old[j]) - order.begin(), 3) << j;
    }
    int removed = 0, stored = 0;
    for (const ManagerEvent& e : d.m().TakeEvents()) {
      removed += e.kind == KvEvent::Kind::kRemoved;
      stored += e.kind == KvEvent::Kind::kStored;
    }
    EXPECT_EQ(removed, 3);
    EXPECT_EQ(stored, 3);
    d.Free(3);
    // Twelve fresh blocks: the nine caching nothing, then the three least recently freed cached
    // ones, which are now Q's. P, computed last, is still whole.
    d.Add(4, Seq(48, 9000));
    d.Prefill(4);
    d.Add(5, Seq(13, 100));
    EXPECT_EQ(d.Lookup(5).tokens, 12);
    d.Add(6, Seq(12, 500));
    EXPECT_EQ(d.Lookup(6).tokens, 0);
  }
}

// A rank the caller owns and changes (ManagerConfig::eviction_rank): here, request 2's prefix is
// worth more than request 1's, whatever the order they were freed in, until the caller says
// otherwise and calls Rerank.
class DigestRank final : public EvictionRank {
 public:
  uint64_t Rank(const BlockHash& d) const override {
    for (const auto& [digest, rank] : ranks)
      if (digest == d) return rank;
    return 1;
  }
  std::vector<std::pair<BlockHash, uint64_t>> ranks;
};

TEST(Eviction, ByACallersRankAndRerankedWhenItChanges) {
  auto rank = std::make_shared<DigestRank>();
  ManagerConfig c = MakeConfig({32}, {Full(4)});
  c.eviction_rank = rank;
  Driver d(c);
  const std::vector<int32_t> p1 = Seq(8, 100), p2 = Seq(8, 500);
  const BlockHash a0 = HashBlock(kRootHash, std::span(p1).first(4));
  const BlockHash a1 = HashBlock(a0, std::span(p1).subspan(4, 4));
  const BlockHash b0 = HashBlock(kRootHash, std::span(p2).first(4));
  const BlockHash b1 = HashBlock(b0, std::span(p2).subspan(4, 4));
  rank->ranks = {{a0, 20}, {a1, 10}, {b0, 40}, {b1, 30}};
  d.Add(1, p1);
  d.Prefill(1);
  d.Add(2, p2);
  d.Prefill(2);
  const auto a = d.Table(1, 0), b = d.Table(2, 0);
  d.Free(2);  // freed first, yet worth more: evicted last
  d.Free(1);
  auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  EXPECT_EQ(std::vector<int32_t>(order.end() - 4, order.end()),
            (std::vector<int32_t>{a[1], a[0], b[1], b[0]}));
  // Request 1's prefix becomes the more valuable; nothing moves until the caller says so.
  rank->ranks = {{a0, 60}, {a1, 50}, {b0, 40}, {b1, 30}};
  EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 0), order);
  const BlockHash changed[] = {a0, a1};
  ASSERT_TRUE(d.m().Rerank(changed).ok());
  order = ManagerProbe::FreeListOrder(d.m(), 0);
  EXPECT_EQ(std::vector<int32_t>(order.end() - 4, order.end()),
            (std::vector<int32_t>{b[1], b[0], a[1], a[0]}));
  ASSERT_TRUE(d.m().CheckInvariants().ok());
  // Without a rank there is nothing to requeue by.
  Driver lru(MakeConfig({32}, {Full(4)}));
  const Status none = lru.m().Rerank(changed);
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("no eviction rank"), std::string::npos) << none.message();
}

TEST(Eviction, BlocksWithoutIdentityAreReusedFirst) {
  Driver d(MakeConfig({32}, {Full(4)}));
  d.Add(1, Seq(10));
  d.Prefill(1);
  const auto a = d.Table(1, 0);
  d.Free(1);
  const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  EXPECT_EQ(order.front(), a[2]);  // the partial block holds nothing anyone can hit
  EXPECT_EQ(order[order.size() - 2], a[1]);
  EXPECT_EQ(order.back(), a[0]);
  // Exactly the never-published blocks are the ones an engine may poison; a bad pool is named.
  std::vector<int32_t> uncached;
  ASSERT_TRUE(ManagerProbe::UncachedFreeBlocks(d.m(), 0, uncached).ok());
  EXPECT_EQ(uncached.size(), 29u);  // 31 blocks (32 with the null one) but the 2 published
  EXPECT_EQ(uncached.front(), a[2]);
  EXPECT_EQ(std::count(uncached.begin(), uncached.end(), a[0]), 0);
  EXPECT_EQ(std::count(uncached.begin(), uncached.end(), a[1]), 0);
  const Status bad = ManagerProbe::UncachedFreeBlocks(d.m(), 1, uncached);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("pool 1"), std::string::npos) << bad.message();
  EXPECT_EQ(uncached.size(), 29u);
}

TEST(Eviction, LowRetentionRequestsAreEvictedBeforeOthers) {
  Driver d(MakeConfig({32}, {Full(4)}));
  d.Add(1, Seq(8, 100));
  d.Prefill(1);
  RequestSpec low;
  low.retention = Retention::kLow;
  d.Add(2, Seq(8, 500), low);
  d.Prefill(2);
  const auto b = d.Table(2, 0);
  d.Free(1);
  d.Free(2);
  const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + 2), Reversed(b));
  d.Add(3, Seq(8, 500));
  EXPECT_EQ(d.Lookup(3).tokens, 4);  // still cached until reused
}

TEST(Eviction, AReusedBlockLosesItsIdentity) {
  Driver d(MakeConfig({6}, {Full(4)}));
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  const auto a = d.Table(1, 0);
  d.Free(1);
  d.m().TakeEvents();
  d.Add(2, Seq(8, 500));
  d.Prefill(2);  // takes the one never-used block, then request 1's tail block
  const auto events = d.m().TakeEvents();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block, a[3]);
  d.Add(3, Seq(17, 100));
  EXPECT_EQ(d.Lookup(3).tokens, 12);
  // The block now holds request 2's tokens under request 2's identity only.
  d.Add(4, Seq(9, 500));
  EXPECT_EQ(d.Lookup(4).tokens, 8);
}

TEST(Eviction, EventsNameTheirGroup) {
  Driver d(MakeConfig({64}, {Full(4), Window(4, 4)}));
  d.Add(1, Seq(9));
  d.Prefill(1);
  const auto events = d.m().TakeEvents();
  int stored[2] = {0, 0};
  for (const ManagerEvent& e : events) {
    ASSERT_EQ(e.kind, KvEvent::Kind::kStored);
    ++stored[e.group];
  }
  EXPECT_EQ(stored[0], 2);
  EXPECT_EQ(stored[1], 2);
  d.Free(1);
  ASSERT_TRUE(d.m().ResetPrefixCache().ok());
  const auto cleared = d.m().TakeEvents();
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(cleared[0].kind, KvEvent::Kind::kCleared);
  EXPECT_EQ(d.m().Usage(0).num_cached, 0);
}

// Lookup keeps the blocks it found for the first Allocate, for as long as no identity leaves a
// block. A hit whose blocks were evicted in between is refused as stale with nothing taken; once
// the same prefix is cached again in other blocks, the same hit is taken from where it now lives.
TEST(Eviction, AHitEvictedBetweenLookupAndAllocate) {
  Driver d(MakeConfig({9}, {Full(4)}));  // 8 blocks
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  const std::vector<int32_t> first = d.Table(1, 0);
  d.Free(1);
  d.Add(2, Seq(17, 100));
  const PrefixHit hit = d.Lookup(2);
  ASSERT_EQ(hit.tokens, 16);
  // Request 3 takes every block, request 1's cached ones included.
  d.Add(3, Seq(32, 900));
  d.Prefill(3);
  const std::vector<int32_t> third = d.Table(3, 0);
  for (int32_t b : first)
    EXPECT_NE(std::find(third.begin(), third.end(), b), third.end());
  const Status stale = d.m().Allocate(2, 1, hit);
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition) << stale.ToString();
  EXPECT_NE(stale.message().find("went stale"), std::string::npos) << stale.message();
  d.Check();
  EXPECT_EQ(d.m().NumComputed(2).value(), 0);
  // The prefix is computed and cached again, in blocks request 3 gave up.
  d.Free(3);
  d.Add(4, Seq(16, 100));
  d.Prefill(4);
  const std::vector<int32_t> fourth = d.Table(4, 0);
  d.Free(4);
  d.Run(2, 1, hit);
  const std::vector<int32_t> second = d.Table(2, 0);
  ASSERT_GE(second.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(second.begin(), second.begin() + 4), fourth);
}

TEST(Eviction, AllocationFailureLeavesEverythingUnchanged) {
  Driver d(MakeConfig({10, 10}, {Full(4, 0), Window(4, 4, 1)}));
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  d.Free(1);
  d.Add(2, Seq(17, 100));
  const PrefixHit hit = d.Lookup(2);
  ASSERT_EQ(hit.tokens, 16);
  const auto before0 = ManagerProbe::FreeListOrder(d.m(), 0),
             before1 = ManagerProbe::FreeListOrder(d.m(), 1);
  const auto usage = d.m().Usage(0);
  // 16 hit tokens + 24 new need 10 blocks in pool 0 (9 exist); pool 1 alone would suffice.
  Status s = d.m().Allocate(2, 24, hit);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("pool 0"), std::string::npos) << s.message();
  d.Check();
  EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 0), before0);
  EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 1), before1);
  EXPECT_EQ(d.m().Usage(0).num_cached, usage.num_cached);
  EXPECT_EQ(d.m().stats().allocations_failed, 1);
  EXPECT_EQ(d.m().NumComputed(2).value(), 0);
  // The same hit still works with a step that fits.
  ASSERT_TRUE(d.m().Allocate(2, 1, hit).ok());
  d.Check();
}

TEST(Eviction, LookaheadReservesSlotsBeyondTheStep) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(6));
  ASSERT_TRUE(d.m().Allocate(1, 6, {}, 5).ok());
  d.Check();
  const StepInfo step = d.m().Step(1).value();
  EXPECT_EQ(step.end, 6);
  EXPECT_EQ(step.reserved_end, 11);
  EXPECT_EQ(d.Table(1, 0).size(), 3u);
  std::vector<int64_t> slots;
  ASSERT_TRUE(d.m().SlotMapping(1, 0, 6, 11, slots).ok());
  EXPECT_EQ(slots.size(), 5u);
  EXPECT_FALSE(d.m().SlotMapping(1, 0, 6, 12, slots).ok());
  ASSERT_TRUE(d.m().Commit(1, 6).ok());
  // The next step reuses the reserved blocks: nothing new is taken.
  const int32_t free_before = d.m().Usage(0).num_free;
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{7}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  EXPECT_EQ(d.m().Usage(0).num_free, free_before);
  d.Check();
}

TEST(Eviction, WindowGroupsHoldOnlyTheirWindow) {
  Driver d(MakeConfig({64, 64}, {Full(4, 0), Window(8, 4, 1, 4)}));
  d.Add(1, Seq(5));
  d.Prefill(1);
  for (int32_t t = 0; t < 40; ++t)
    d.Decode(1, t);
  const auto w = d.Table(1, 1);
  const int64_t held = std::count_if(w.begin(), w.end(), [](int32_t b) { return b != 0; });
  // 45 tokens: the sink block, and blocks 9..11 holding [38, 45), what position 45 attends to.
  EXPECT_EQ(held, 4);
  EXPECT_NE(w[0], 0);
  EXPECT_EQ(w[8], 0);
  EXPECT_EQ(d.m().Usage(1).num_blocks - d.m().Usage(1).num_free, 4);
  EXPECT_EQ(d.Table(1, 0).size(), 12u);
}

}  // namespace
}  // namespace hkv::testing
