// SlabArena: slabs carved into page classes, memory moving between classes, one age order for
// eviction across classes, all-or-nothing reservation, and stranded memory under adversarial
// allocation patterns.
#include <algorithm>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include <hkv/pool/slab_arena.h>

namespace hkv {
namespace {

PrefixKey Key(uint64_t n, int32_t group = 0) {
  return {{n, n * 131 + 5}, group};
}

struct Memory {
  SlabArena arena;
  std::vector<BlockPool> pools;

  Memory(int64_t slabs, std::vector<int32_t> per) {
    arena = SlabArena::Create(slabs, per).value();
    pools = arena.MakePools(true).value();
  }
  // Reserve then allocate, as the manager does.
  Status Take(std::vector<int64_t> need, std::vector<std::vector<int32_t>>& out) {
    HKV_RETURN_IF_ERROR(arena.Reserve(pools, need));
    out.resize(need.size());
    for (size_t p = 0; p < need.size(); ++p) {
      Status s = pools[p].Allocate(static_cast<int32_t>(need[p]), out[p]);
      if (!s.ok()) return Status::FailedPrecondition("allocate after reserve: " + s.message());
    }
    return Status::Ok();
  }
  // Class 0 takes one page per key, publishes them in order and frees them: the pages stay
  // cached, their slabs empty in that order.
  std::vector<int32_t> CacheInClass0(const std::vector<uint64_t>& keys) {
    std::vector<std::vector<int32_t>> got;
    std::vector<int64_t> need(pools.size(), 0);
    need[0] = static_cast<int64_t>(keys.size());
    EXPECT_TRUE(Take(need, got).ok());
    for (size_t i = 0; i < keys.size(); ++i)
      EXPECT_TRUE(pools[0].Publish(got[0][i], Key(keys[i])).ok());
    EXPECT_TRUE(pools[0].Free(got[0]).ok());
    return got[0];
  }
  void Check() const {
    const Status s = arena.CheckInvariants(pools);
    ASSERT_TRUE(s.ok()) << s.message();
  }
};

TEST(SlabArenaTest, RejectsBadShapes) {
  const std::vector<int32_t> ok = {4, 2};
  EXPECT_EQ(SlabArena::Create(0, ok).status().code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> zero = {4, 0};
  const Status s = SlabArena::Create(3, zero).status();
  EXPECT_NE(s.message().find("class 1 has 0 pages per slab; expected >= 1"), std::string::npos)
      << s.message();
  const std::vector<int32_t> large = {1 << 12};
  const Status too_many = SlabArena::Create(int64_t{1} << 19, large).status();
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("2147483648 pages over 524288 slabs; expected at most"),
            std::string::npos)
      << too_many.message();
  EXPECT_EQ(SlabArena::Create(3, {}).status().code(), StatusCode::kInvalidArgument);
  Memory m(3, {4, 2});
  EXPECT_EQ(m.arena.Reserve(m.pools, std::vector<int64_t>{1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.arena.Reserve(m.pools, std::vector<int64_t>{-1, 0}).code(),
            StatusCode::kInvalidArgument);
}

TEST(SlabArenaTest, ClassesAreCarvedFromSlabsOnDemand) {
  Memory m(3, {4, 2});
  EXPECT_EQ(m.pools[0].num_owned(), 0);
  std::vector<std::vector<int32_t>> got;
  ASSERT_TRUE(m.Take({5, 1}, got).ok());
  m.Check();
  // Class 0 needed two slabs (4 pages each), class 1 one (2 pages): slabs 0, 1 then 2.
  EXPECT_EQ(m.arena.owner(0), 0);
  EXPECT_EQ(m.arena.owner(1), 0);
  EXPECT_EQ(m.arena.owner(2), 1);
  EXPECT_EQ(m.arena.num_unassigned(), 0);
  // Block ids locate the page: 1 + slab * pages_per_slab + page.
  for (int32_t b : got[0])
    EXPECT_LT(m.pools[0].segment_of(b), 2);
  EXPECT_EQ(m.pools[1].segment_of(got[1][0]), 2);
  const ArenaUsage u = m.arena.Usage(m.pools);
  EXPECT_EQ(u.classes[0].slabs, 2);
  EXPECT_EQ(u.classes[0].held_pages, 5);
  EXPECT_EQ(u.classes[0].free_pages, 3);
  EXPECT_EQ(u.classes[1].held_pages, 1);
}

TEST(SlabArenaTest, AFreedSlabMovesToTheClassThatNeedsIt) {
  Memory m(4, {4, 2});
  std::vector<std::vector<int32_t>> a;
  ASSERT_TRUE(m.Take({16, 0}, a).ok());  // class 0 holds the whole arena
  std::vector<std::vector<int32_t>> b;
  EXPECT_EQ(m.Take({0, 1}, b).code(), StatusCode::kResourceExhausted);
  // Freeing three pages of one slab is not enough: the slab still holds a page.
  const int32_t slab = m.pools[0].segment_of(a[0][0]);
  std::vector<int32_t> some;
  for (int32_t blk : a[0]) {
    if (m.pools[0].segment_of(blk) == slab && some.size() < 3) some.push_back(blk);
  }
  ASSERT_TRUE(m.pools[0].Free(some).ok());
  EXPECT_EQ(m.arena.Reserve(m.pools, std::vector<int64_t>{0, 1}).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(m.arena.Usage(m.pools).classes[0].stranded_pages, 3);
  for (int32_t blk : a[0]) {
    if (m.pools[0].segment_of(blk) == slab &&
        std::find(some.begin(), some.end(), blk) == some.end()) {
      ASSERT_TRUE(m.pools[0].Free(std::vector<int32_t>{blk}).ok());
    }
  }
  ASSERT_TRUE(m.Take({0, 2}, b).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(slab), 1);
  EXPECT_EQ(m.pools[0].num_owned(), 12);
  EXPECT_EQ(m.pools[1].num_owned(), 2);
}

TEST(SlabArenaTest, TakingACachedSlabDropsItsIdentitiesAndIsAllOrNothing) {
  Memory m(2, {2, 1});
  std::vector<std::vector<int32_t>> a;
  ASSERT_TRUE(m.Take({4, 0}, a).ok());
  for (size_t i = 0; i < a[0].size(); ++i)
    ASSERT_TRUE(m.pools[0].Publish(a[0][i], Key(i)).ok());
  (void)m.pools[0].TakeEvents();
  ASSERT_TRUE(m.pools[0].Free(a[0]).ok());  // both slabs empty, still caching
  EXPECT_EQ(m.pools[0].Find(Key(0)), a[0][0]);
  // Class 1 asks for more than one slab can give while class 0 keeps its need: refused, and
  // nothing moved or lost its identity.
  const std::vector<int32_t> order = m.pools[0].FreeListOrder();
  EXPECT_EQ(m.arena.Reserve(m.pools, std::vector<int64_t>{3, 1}).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(m.pools[0].FreeListOrder(), order);
  EXPECT_EQ(m.pools[0].num_cached(), 4);
  EXPECT_EQ(m.arena.owner(0), 0);
  m.Check();
  // One slab is enough: the one emptied first goes. Both emptied in this Free call; the slab of
  // the first two pages freed emptied first.
  const int32_t first = m.pools[0].segment_of(a[0][0]);
  ASSERT_EQ(m.pools[0].segment_of(a[0][1]), first);
  std::vector<std::vector<int32_t>> b;
  ASSERT_TRUE(m.Take({0, 1}, b).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(first), 1);
  EXPECT_EQ(m.pools[0].Find(Key(0)), -1);
  EXPECT_EQ(m.pools[0].Find(Key(1)), -1);
  EXPECT_GE(m.pools[0].Find(Key(2)), 0);
  int removed = 0;
  for (const KvEvent& e : m.pools[0].TakeEvents())
    removed += e.kind == KvEvent::Kind::kRemoved;
  EXPECT_EQ(removed, 2);
}

TEST(SlabArenaTest, EvictionFollowsOneAgeOrderAcrossClasses) {
  // Class 0 caches a slab freed long ago; class 1 caches pages freed recently. When class 1
  // needs a page it takes class 0's old slab rather than evicting its own newer page, and the
  // other way round once its own page is the older one.
  Memory m(3, {1, 1});
  std::vector<std::vector<int32_t>> got;
  ASSERT_TRUE(m.Take({1, 2}, got).ok());
  ASSERT_TRUE(m.pools[0].Publish(got[0][0], Key(100)).ok());
  ASSERT_TRUE(m.pools[1].Publish(got[1][0], Key(1)).ok());
  ASSERT_TRUE(m.pools[1].Publish(got[1][1], Key(2)).ok());
  ASSERT_TRUE(m.pools[0].Free(got[0]).ok());  // oldest
  ASSERT_TRUE(m.pools[1].Free(std::vector<int32_t>{got[1][0]}).ok());
  ASSERT_TRUE(m.pools[1].Free(std::vector<int32_t>{got[1][1]}).ok());
  std::vector<std::vector<int32_t>> next;
  ASSERT_TRUE(m.Take({0, 1}, next).ok());
  m.Check();
  EXPECT_EQ(m.pools[0].Find(Key(100)), -1);  // class 0's old slab went
  EXPECT_GE(m.pools[1].Find(Key(1)), 0);
  EXPECT_GE(m.pools[1].Find(Key(2)), 0);
  // Class 1 frees the page it just took (no identity): that slab caches nothing, so when class 0
  // needs a page it takes that one and class 1's cached pages stay.
  ASSERT_TRUE(m.pools[1].Free(next[1]).ok());
  std::vector<std::vector<int32_t>> more;
  ASSERT_TRUE(m.Take({1, 0}, more).ok());
  m.Check();
  EXPECT_GE(m.pools[1].Find(Key(1)), 0);
  EXPECT_GE(m.pools[1].Find(Key(2)), 0);
  // Class 0's slab now caches a page freed after both of class 1's: class 1, needing two pages,
  // evicts its own older pages and class 0 keeps its slab.
  ASSERT_TRUE(m.pools[0].Publish(more[0][0], Key(200)).ok());
  ASSERT_TRUE(m.pools[0].Free(more[0]).ok());
  std::vector<std::vector<int32_t>> last;
  ASSERT_TRUE(m.Take({0, 2}, last).ok());
  m.Check();
  EXPECT_GE(m.pools[0].Find(Key(200)), 0);
  EXPECT_EQ(m.pools[1].Find(Key(1)), -1);
  EXPECT_EQ(m.pools[1].Find(Key(2)), -1);
}

TEST(SlabArenaTest, BetweenWorthlessPagesAClassEvictsItsOwn) {
  // Both classes hold one demoted page (worth nothing, queued first). Class 1, needing a page,
  // reuses its own rather than taking class 0's slab: equal worth, and a slab given to a class
  // that fills slabs sparsely rarely comes back.
  Memory m(3, {1, 1});
  std::vector<std::vector<int32_t>> got;
  ASSERT_TRUE(m.Take({1, 2}, got).ok());
  ASSERT_TRUE(m.pools[0].Publish(got[0][0], Key(100)).ok());
  ASSERT_TRUE(m.pools[1].Publish(got[1][0], Key(1)).ok());
  ASSERT_TRUE(m.pools[0].Free(got[0]).ok());
  ASSERT_TRUE(m.pools[1].Free(std::vector<int32_t>{got[1][0]}).ok());
  ASSERT_TRUE(m.pools[0].Demote(got[0][0]).ok());
  ASSERT_TRUE(m.pools[1].Demote(got[1][0]).ok());
  std::vector<std::vector<int32_t>> next;
  ASSERT_TRUE(m.Take({0, 1}, next).ok());
  m.Check();
  EXPECT_GE(m.pools[0].Find(Key(100)), 0);
  EXPECT_EQ(m.pools[1].Find(Key(1)), -1);
  EXPECT_EQ(next[1][0], got[1][0]);
}

// CheckReserve answers what Reserve would - success, the same refusal, the same argument
// errors, kept slabs honoured - and moves nothing either way.
TEST(SlabArenaTest, CheckReserveAnswersAsReserveWouldAndMovesNothing) {
  Memory m(2, {1, 1});
  const std::vector<int32_t> cached = m.CacheInClass0({1, 2});
  ASSERT_EQ(cached.size(), 2u);
  const auto owners = [&] { return std::vector<int32_t>{m.arena.owner(0), m.arena.owner(1)}; };
  const std::vector<int32_t> before = owners();
  const std::vector<PoolBlock> keep = {{0, cached[0]}};
  const std::vector<int64_t> one_each = {1, 1}, two = {0, 2};
  EXPECT_TRUE(m.arena.CheckReserve(m.pools, one_each, keep).ok());
  // Class 1 would need both slabs, and one is kept.
  const Status kept = m.arena.CheckReserve(m.pools, two, keep);
  EXPECT_EQ(kept.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kept.message(), m.arena.Reserve(m.pools, two, keep).message());
  EXPECT_TRUE(m.arena.CheckReserve(m.pools, two).ok());
  const std::vector<PoolBlock> outside = {{0, 99}};
  EXPECT_EQ(m.arena.CheckReserve(m.pools, std::vector<int64_t>{0, 0}, outside).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(owners(), before);
  EXPECT_EQ(m.pools[0].Find(Key(1)), cached[0]);
  EXPECT_EQ(m.pools[0].Find(Key(2)), cached[1]);
  m.Check();
  // And Reserve does what CheckReserve said it could.
  ASSERT_TRUE(m.arena.Reserve(m.pools, one_each, keep).ok());
  EXPECT_EQ(m.pools[1].num_owned(), 1);
  m.Check();
}

TEST(SlabArenaTest, KeptBlocksHoldTheirSlab) {
  Memory m(2, {1, 1});
  const std::vector<int32_t> cached = m.CacheInClass0({1, 2});  // Key(1)'s slab emptied first
  ASSERT_EQ(cached.size(), 2u);
  // A caller about to acquire Key(1) keeps it: class 1 gets the other slab.
  const std::vector<PoolBlock> keep = {{0, cached[0]}};
  ASSERT_TRUE(m.arena.Reserve(m.pools, std::vector<int64_t>{1, 1}, keep).ok());
  m.Check();
  EXPECT_EQ(m.pools[0].Find(Key(1)), cached[0]);
  EXPECT_EQ(m.pools[0].Find(Key(2)), -1);
  // With the only empty slab kept, nothing can be given.
  std::vector<std::vector<int32_t>> b;
  ASSERT_TRUE(m.pools[1].Allocate(1, b.emplace_back()).ok());
  EXPECT_EQ(m.arena.Reserve(m.pools, std::vector<int64_t>{0, 1}, keep).code(),
            StatusCode::kResourceExhausted);
  const auto refused = [&](PoolBlock kept, const std::string& what) {
    const std::vector<PoolBlock> bad = {kept};
    const Status s = m.arena.Reserve(m.pools, std::vector<int64_t>{0, 0}, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    m.Check();
  };
  refused({0, 99}, "kept block 99 of pool 0: expected 1 to 2");
  refused({0, 0}, "kept block 0 of pool 0: expected 1 to 2");
  refused({2, 1}, "kept block 1 names pool 2: expected 0 to 1");
}

// A kept block in a slab its pool does not own (dormant there, or owned by another class) is
// refused before anything is marked: it used to count another class's slab as kept and abort.
TEST(SlabArenaTest, AKeptBlockOutsideItsPoolsSlabsIsRefused) {
  Memory m(2, {1, 1});
  std::vector<std::vector<int32_t>> a;
  ASSERT_TRUE(m.Take({1, 1}, a).ok());
  ASSERT_TRUE(m.pools[1].Free(a[1]).ok());  // class 1 owns an empty slab; none is unassigned
  const int32_t slab = m.pools[1].segment_of(a[1][0]);
  // Block of class 0 in the slab class 1 owns: dormant in pool 0. Class 0 needs that slab.
  const std::vector<PoolBlock> keep = {{0, 1 + slab}};
  const Status s = m.arena.Reserve(m.pools, std::vector<int64_t>{1, 0}, keep);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not own"), std::string::npos) << s.message();
  m.Check();
  EXPECT_EQ(m.arena.Usage(m.pools).classes[1].slabs, 1);
  // Without the bad keep the same reservation moves the slab.
  EXPECT_TRUE(m.arena.Reserve(m.pools, std::vector<int64_t>{1, 0}).ok());
  m.Check();
  EXPECT_EQ(m.arena.Usage(m.pools).classes[0].slabs, 2);
}

TEST(SlabArenaTest, ReserveNeverTakesAClassBelowItsOwnNeed) {
  Memory m(2, {2, 2});
  std::vector<std::vector<int32_t>> got;
  ASSERT_TRUE(m.Take({4, 0}, got).ok());
  ASSERT_TRUE(m.pools[0].Free(got[0]).ok());  // class 0: two empty, uncached slabs
  // Both classes need pages in one call: class 0 keeps what it needs, class 1 gets the rest.
  std::vector<std::vector<int32_t>> both;
  ASSERT_TRUE(m.Take({2, 2}, both).ok());
  m.Check();
  EXPECT_EQ(m.pools[0].num_owned(), 2);
  EXPECT_EQ(m.pools[1].num_owned(), 2);
}

// Random allocation and frees over three classes whose slabs hold 1, 3 and 8 pages; pages are
// published now and then, and the same request may be freed in any order. After every call the
// arena and pool invariants hold; a class that gained slabs has fewer than a slab's worth of
// free pages left (it takes a slab only once its own free pages are used up); and stranded
// memory is measured.
TEST(SlabArenaTest, AdversarialPatternsKeepInvariantsAndBoundStrandedPages) {
  const std::vector<int32_t> per = {1, 3, 8};
  Memory m(40, per);
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> held(per.size());
  uint64_t key = 0;
  int64_t max_stranded = 0, refused = 0, moved = 0;
  for (int step = 0; step < 6000; ++step) {
    const size_t p = rng() % per.size();
    if (rng() % 5 < 3) {
      std::vector<int64_t> need(per.size(), 0);
      need[p] = 1 + static_cast<int64_t>(rng() % 12);
      if (rng() % 4 == 0) need[(p + 1) % per.size()] = 1 + static_cast<int64_t>(rng() % 5);
      const ArenaUsage before = m.arena.Usage(m.pools);
      std::vector<std::vector<int32_t>> got;
      const Status s = m.Take(need, got);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
        ++refused;
        const ArenaUsage after = m.arena.Usage(m.pools);
        for (size_t q = 0; q < per.size(); ++q) {
          ASSERT_EQ(after.classes[q].slabs, before.classes[q].slabs);
          ASSERT_EQ(after.classes[q].cached_pages, before.classes[q].cached_pages);
        }
      } else {
        const ArenaUsage after = m.arena.Usage(m.pools);
        for (size_t q = 0; q < per.size(); ++q) {
          held[q].insert(held[q].end(), got[q].begin(), got[q].end());
          if (after.classes[q].slabs > before.classes[q].slabs &&
              before.classes[q].cached_pages == 0) {
            ++moved;
            ASSERT_LT(after.classes[q].free_pages, per[q]) << "class " << q << " step " << step;
          }
        }
        for (size_t q = 0; q < per.size(); ++q) {
          for (int32_t b : got[q]) {
            if (rng() % 3 == 0) {
              ASSERT_TRUE(m.pools[q].Publish(b, Key(++key, static_cast<int32_t>(q))).ok());
            }
          }
        }
      }
    } else if (!held[p].empty()) {
      // Free a random subset: every other page, a random run, or everything.
      std::vector<int32_t> drop;
      std::vector<int32_t> keep;
      const int mode = static_cast<int>(rng() % 3);
      for (size_t i = 0; i < held[p].size(); ++i) {
        const bool go = mode == 0 ? i % 2 == 0 : mode == 1 ? rng() % 2 == 0 : true;
        (go ? drop : keep).push_back(held[p][i]);
      }
      ASSERT_TRUE(
          m.pools[p].Free(drop, rng() % 4 == 0 ? Retention::kLow : Retention::kNormal).ok());
      held[p] = keep;
    }
    m.Check();
    const ArenaUsage u = m.arena.Usage(m.pools);
    int64_t stranded = 0;
    for (size_t q = 0; q < per.size(); ++q) {
      stranded += u.classes[q].stranded_pages;
      ASSERT_LE(u.classes[q].stranded_pages, u.classes[q].free_pages);
    }
    max_stranded = std::max(max_stranded, stranded);
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(moved, 0);
  RecordProperty("max_stranded_pages", static_cast<int>(max_stranded));
}

TEST(SlabArenaTest, SegmentCallsRejectWrongArgumentsAndChangeNothing) {
  const auto refused = [](int32_t segments, int32_t blocks, const std::string& what) {
    const Status s =
        BlockPool::CreateSegmented(segments, blocks, std::make_shared<uint64_t>(0)).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  refused(0, 4, "0 segments: expected >= 1");
  refused(2, 0, "0 blocks per segment: expected >= 1");
  refused(1 << 16, 1 << 15, "2147483648 blocks; expected at most 2^31 - 2");
  EXPECT_EQ(BlockPool::CreateSegmented(2, 4, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  BlockPool p = BlockPool::CreateSegmented(2, 4, std::make_shared<uint64_t>(0)).value();
  EXPECT_EQ(p.num_owned(), 0);
  std::vector<int32_t> got;
  EXPECT_EQ(p.Allocate(1, got).code(), StatusCode::kResourceExhausted);  // dormant blocks
  EXPECT_EQ(p.Acquire(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.Reacquire(1).code(), StatusCode::kFailedPrecondition);  // dormant, not free
  EXPECT_EQ(p.AddSegment(2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.RemoveSegment(0).code(), StatusCode::kFailedPrecondition);  // not owned
  ASSERT_TRUE(p.AddSegment(1).ok());
  const Status twice = p.AddSegment(1);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("already owned"), std::string::npos) << twice.message();
  ASSERT_TRUE(p.Allocate(1, got).ok());
  EXPECT_EQ(p.segment_of(got[0]), 1);
  const std::vector<int32_t> order = p.FreeListOrder();
  const Status held = p.RemoveSegment(1);
  EXPECT_EQ(held.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(held.message().find("1 held block"), std::string::npos) << held.message();
  EXPECT_EQ(p.FreeListOrder(), order);
  EXPECT_EQ(p.num_owned(), 4);
  EXPECT_TRUE(p.CheckInvariants().ok());
}

// A slab caching nothing is free to take only while its class has other uncached pages for its
// own need. Here class 0 (one page per slab) keeps a cached checkpoint and one empty page, and
// needs one page; class 1 needs one and has only demoted pages. Taking class 0's empty slab would
// make it evict its checkpoint to serve its need, so class 1 reuses a demoted page of its own
// instead, and the checkpoint survives. Then class 0 has an uncached page beyond its need:
// class 1 takes it to spare its own cached pages unless class 0 holds recurrent states
// (SetStateClasses), whose uncached pages are their running requests' churn; short of pages,
// class 1 takes it either way.
void UncachingSlabScenario(bool states) {
  Memory m(3, {1, 4});
  if (states) {
    ASSERT_TRUE(m.arena.SetStateClasses(std::vector<int32_t>{0}).ok());
  }
  std::vector<std::vector<int32_t>> got;
  ASSERT_TRUE(m.Take({2, 4}, got).ok());
  const int32_t checkpoint = got[0][0], empty = got[0][1];
  ASSERT_TRUE(m.pools[0].Publish(checkpoint, Key(1)).ok());
  for (size_t k = 0; k < got[1].size(); ++k)
    ASSERT_TRUE(m.pools[1].Publish(got[1][k], Key(10 + k, 1)).ok());
  ASSERT_TRUE(m.pools[1].Free(got[1]).ok());
  for (int32_t b : got[1])
    ASSERT_TRUE(m.pools[1].Demote(b).ok());
  ASSERT_TRUE(m.pools[0].Free({&checkpoint, 1}).ok());
  ASSERT_TRUE(m.pools[0].Free({&empty, 1}, Retention::kLow).ok());
  m.Check();

  std::vector<std::vector<int32_t>> next;
  ASSERT_TRUE(m.Take({1, 1}, next).ok());
  m.Check();
  EXPECT_EQ(next[0], std::vector<int32_t>{empty});
  EXPECT_EQ(m.pools[0].Find(Key(1)), checkpoint);
  EXPECT_EQ(m.arena.owner(m.pools[0].segment_of(empty)), 0);

  ASSERT_TRUE(m.pools[0].Free(next[0], Retention::kLow).ok());
  ASSERT_TRUE(m.pools[1].Free(next[1], Retention::kLow).ok());
  std::vector<std::vector<int32_t>> third;
  ASSERT_TRUE(m.Take({0, 4}, third).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(m.pools[0].segment_of(empty)), states ? 0 : 1);
  EXPECT_EQ(m.pools[1].num_owned(), states ? 4 : 8);
  EXPECT_EQ(m.pools[0].Find(Key(1)), checkpoint);
  if (!states) return;

  ASSERT_TRUE(m.pools[1].Free(third[1], Retention::kLow).ok());
  std::vector<std::vector<int32_t>> fourth;
  ASSERT_TRUE(m.Take({0, 8}, fourth).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(m.pools[0].segment_of(empty)), 1);
  EXPECT_EQ(m.pools[0].Find(Key(1)), checkpoint);
}

TEST(SlabArenaTest, AnUncachingSlabItsClassStillNeedsIsNotTakenFromIt) {
  UncachingSlabScenario(true);
}

TEST(SlabArenaTest, AnUncachingSlabOfAClassWithoutStatesIsTakenToSpareCache) {
  UncachingSlabScenario(false);
}

TEST(SlabArenaTest, StateClassesOutOfRangeAreRefused) {
  SlabArena a = SlabArena::Create(2, std::vector<int32_t>{1, 4}).value();
  for (int32_t bad : {-1, 2}) {
    const Status s = a.SetStateClasses(std::vector<int32_t>{0, bad});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("state class " + std::to_string(bad)), std::string::npos)
        << s.message();
  }
  EXPECT_FALSE(a.is_state_class(0));  // refused calls mark nothing
  ASSERT_TRUE(a.SetStateClasses(std::vector<int32_t>{0}).ok());
  EXPECT_TRUE(a.is_state_class(0));
  EXPECT_FALSE(a.is_state_class(1));
}

}  // namespace
}  // namespace hkv
