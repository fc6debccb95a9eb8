// Compaction of two-level memory: BlockPool::MoveHeld hands a held page's references and identity
// to a free page; SlabArena plans which slabs of a class to empty and performs the moves, so that
// stranded pages (free in slabs their class still holds) become shared memory again.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include <hkv/pool/slab_arena.h>

namespace hkv {
namespace {

PrefixKey Key(uint64_t n, int32_t group = 0) {
  return {{n, n * 131 + 5}, group};
}

// Everything a failed call must leave as it was.
struct PoolState {
  std::vector<int32_t> refs, free_list;
  std::vector<uint8_t> identity;
  int32_t cached = 0, owned = 0;

  explicit PoolState(const BlockPool& p)
      : free_list(p.FreeListOrder()), cached(p.num_cached()), owned(p.num_owned()) {
    for (int32_t b = 0; b < p.num_blocks(); ++b) {
      refs.push_back(p.ref_count(b));
      identity.push_back(p.has_identity(b) ? 1 : 0);
    }
  }
  bool operator==(const PoolState&) const = default;
};

void ExpectOk(const BlockPool& p) {
  const Status s = p.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s.message();
}

struct Memory {
  SlabArena arena;
  std::vector<BlockPool> pools;
  std::vector<std::vector<int32_t>> held;  // per class: pages the test holds, one entry per ref

  Memory(int64_t slabs, std::vector<int32_t> per) : held(per.size()) {
    arena = SlabArena::Create(slabs, per).value();
    pools = arena.MakePools(true).value();
  }
  Status Take(std::vector<int64_t> need) {
    HKV_RETURN_IF_ERROR(arena.Reserve(pools, need));
    for (size_t p = 0; p < need.size(); ++p) {
      Status s = pools[p].Allocate(static_cast<int32_t>(need[p]), held[p]);
      if (!s.ok()) return Status::FailedPrecondition("allocate after reserve: " + s.message());
    }
    return Status::Ok();
  }
  // Frees the held pages of class p whose index in `held` satisfies `drop`.
  template <class F>
  void Drop(size_t p, F drop) {
    std::vector<int32_t> go, keep;
    for (size_t i = 0; i < held[p].size(); ++i)
      (drop(i) ? go : keep).push_back(held[p][i]);
    ASSERT_TRUE(pools[p].Free(go).ok());
    held[p] = keep;
  }
  // Plans and performs a compaction of class p, rewriting the pages the test holds as a cache
  // manager would; returns the plan.
  CompactionPlan Compact(int32_t p, int64_t max_slabs) {
    CompactionPlan plan;
    EXPECT_TRUE(arena.PlanCompaction(pools, p, max_slabs, plan).ok());
    const Status s = arena.Compact(pools, plan);
    EXPECT_TRUE(s.ok()) << s.message();
    std::map<int32_t, int32_t> to;
    for (const PageMove& m : plan.moves)
      to[m.src] = m.dst;
    for (int32_t& b : held[static_cast<size_t>(p)]) {
      auto it = to.find(b);
      if (it != to.end()) b = it->second;
    }
    return plan;
  }
  int64_t Stranded(size_t p) const { return arena.Usage(pools).classes[p].stranded_pages; }
  // Free pages, cached or not, in slabs that still hold pages of class p.
  int64_t FreeInHeldSlabs(size_t p) const {
    int64_t n = 0;
    for (int32_t b = pools[p].NextFree(-1); b >= 0; b = pools[p].NextFree(b))
      n += pools[p].segment_held(pools[p].segment_of(b)) > 0 ? 1 : 0;
    return n;
  }
  void Check() const {
    const Status s = arena.CheckInvariants(pools);
    ASSERT_TRUE(s.ok()) << s.message();
  }
};

TEST(MoveHeldTest, HandsReferencesAndIdentityToTheFreeBlock) {
  BlockPool p = BlockPool::Create(8).value();
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  const int32_t a = got[0], b = got[1], c = got[2];
  ASSERT_TRUE(p.Acquire(a).ok());  // shared: two holders
  ASSERT_TRUE(p.Publish(a, Key(1)).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{b}).ok());
  (void)p.TakeEvents();
  ASSERT_TRUE(p.MoveHeld(a, b).ok());
  ExpectOk(p);
  EXPECT_EQ(p.ref_count(b), 2);
  EXPECT_EQ(p.ref_count(a), 0);
  EXPECT_EQ(p.Find(Key(1)), b);
  EXPECT_FALSE(p.has_identity(a));
  EXPECT_EQ(p.FreeListOrder().front(), a);  // worthless now: reused first
  const std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block, a);
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].block, b);
  EXPECT_EQ(events[1].key, Key(1));
  // Both holders release the new block; it stays cached under the moved key.
  ASSERT_TRUE(p.Free(std::vector<int32_t>{b, b}).ok());
  EXPECT_EQ(p.Find(Key(1)), b);
  ExpectOk(p);

  // A destination still caching an identity loses it; an uncached source moves no identity.
  ASSERT_TRUE(p.Publish(c, Key(2)).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{c}).ok());
  (void)p.TakeEvents();
  got.clear();
  ASSERT_TRUE(p.Allocate(1, got).ok());  // `a`, from the head
  ASSERT_TRUE(p.MoveHeld(got[0], c).ok());
  ExpectOk(p);
  EXPECT_EQ(p.Find(Key(2)), -1);
  EXPECT_EQ(p.ref_count(c), 1);
  EXPECT_FALSE(p.has_identity(c));
  const std::vector<KvEvent> dropped = p.TakeEvents();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(dropped[0].block, c);
}

TEST(MoveHeldTest, KeepsSegmentCountsAndListsRight) {
  Memory m(3, {4});
  ASSERT_TRUE(m.Take({5}).ok());  // one slab full, the other with one page
  const BlockPool& p = m.pools[0];
  const auto lone_it = std::find_if(m.held[0].begin(), m.held[0].end(), [&](int32_t b) {
    return p.segment_held(p.segment_of(b)) == 1;
  });
  ASSERT_NE(lone_it, m.held[0].end());
  const int32_t lone = *lone_it;
  const int32_t from = p.segment_of(lone), full = 1 - from;
  ASSERT_TRUE(m.pools[0].Publish(lone, Key(9)).ok());
  m.Drop(0, [&](size_t i) { return m.held[0][i] == full * 4 + 2; });  // room in the full slab
  const int32_t dst = full * 4 + 2;
  ASSERT_EQ(p.ref_count(dst), 0);
  ASSERT_TRUE(m.pools[0].MoveHeld(lone, dst).ok());
  m.Check();
  EXPECT_EQ(p.segment_held(full), 4);
  EXPECT_EQ(p.segment_cached(full), 1);
  EXPECT_EQ(p.segment_held(from), 0);
  EXPECT_EQ(p.segment_cached(from), 0);
  EXPECT_EQ(p.OldestEmptyUncached(), from);  // plain free memory now
  EXPECT_EQ(p.Find(Key(9)), dst);
}

// A move refused: the code and message expected, and the pool left exactly as it was.
struct MoveCase {
  int32_t src, dst;
  StatusCode code;
  std::string says;
};

void ExpectRefused(Memory& m, BlockPool& p, Status (BlockPool::*move)(int32_t, int32_t),
                   const std::vector<MoveCase>& cases) {
  (void)p.TakeEvents();
  const PoolState before(p);
  for (const MoveCase& c : cases) {
    const Status s = (p.*move)(c.src, c.dst);
    EXPECT_EQ(s.code(), c.code) << c.src << " -> " << c.dst << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    EXPECT_TRUE(PoolState(p) == before) << c.src << " -> " << c.dst;
    EXPECT_TRUE(p.TakeEvents().empty());
    m.Check();
  }
}

TEST(MoveHeldTest, RejectsBadInputAndChangesNothing) {
  Memory m(3, {4});
  ASSERT_TRUE(m.Take({5}).ok());  // slabs 0 and 1; slab 2 is not the pool's
  BlockPool& p = m.pools[0];
  ASSERT_TRUE(p.Publish(m.held[0][0], Key(1)).ok());
  m.Drop(0, [](size_t i) { return i == 2; });
  const int32_t held = m.held[0][0], other = m.held[0][1];
  const int32_t free_block = p.FreeListOrder().front();
  const int32_t dormant = 2 * 4 + 1;  // first page of slab 2
  ExpectRefused(
      m, p, &BlockPool::MoveHeld,
      {
          {0, free_block, StatusCode::kInvalidArgument, "the null block"},
          {held, 0, StatusCode::kInvalidArgument, "the null block"},
          {-1, free_block, StatusCode::kInvalidArgument, "out of range"},
          {held, p.num_blocks(), StatusCode::kInvalidArgument, "out of range"},
          {held, held, StatusCode::kInvalidArgument, "both source and destination"},
          {free_block, other, StatusCode::kFailedPrecondition, "is free"},
          {dormant, free_block, StatusCode::kFailedPrecondition, "does not own"},
          {held, other, StatusCode::kFailedPrecondition, "is held"},
          {held, dormant, StatusCode::kFailedPrecondition, "which this pool does not own"},
      });
}

// A free cached page's identity, share level, continuations and place in the eviction order go
// to another free page; the source is worthless afterwards, at the head of the free list.
TEST(MoveCachedTest, HandsIdentityAndQueuePlaceToTheFreeBlock) {
  Memory m(2, {4});
  ASSERT_TRUE(m.Take({8}).ok());
  BlockPool& p = m.pools[0];
  for (int32_t b : {2, 3, 6})
    ASSERT_TRUE(p.Publish(b, Key(b)).ok());
  ASSERT_TRUE(p.MarkShared(2, 3).ok());
  ASSERT_TRUE(p.AddContinuation(2, 11).ok());
  ASSERT_TRUE(p.AddContinuation(2, 12).ok());
  // Pages 1 and 5 stay held, one in each slab.
  m.Drop(0, [&](size_t i) { return m.held[0][i] == 6; });
  m.Drop(0, [&](size_t i) { return m.held[0][i] == 2; });
  m.Drop(0, [&](size_t i) { return m.held[0][i] == 3; });
  m.Drop(0, [&](size_t i) { return m.held[0][i] == 7; });
  const std::vector<int32_t> before = p.FreeListOrder();
  const uint64_t tick = p.free_tick(2);
  (void)p.TakeEvents();

  ASSERT_TRUE(p.MoveCached(2, 7).ok());
  m.Check();
  EXPECT_EQ(p.Find(Key(2)), 7);
  EXPECT_FALSE(p.has_identity(2));
  EXPECT_EQ(p.free_tick(7), tick);
  EXPECT_EQ(p.share_level(7), 3);
  EXPECT_EQ(p.continuations(7), 2);
  std::vector<int32_t> want = {2};
  for (int32_t b : before) {
    if (b != 7) want.push_back(b == 2 ? 7 : b);
  }
  EXPECT_EQ(p.FreeListOrder(), want);
  std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block, 2);
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].block, 7);
  EXPECT_EQ(events[1].key, Key(2));

  // A destination that caches something loses it first; the moved key is evicted when the
  // source's would have been: after everything freed before it.
  ASSERT_TRUE(p.MoveCached(3, 6).ok());
  m.Check();
  EXPECT_EQ(p.Find(Key(6)), -1);
  EXPECT_EQ(p.Find(Key(3)), 6);
  events = p.TakeEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].key, Key(6));
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[1].key, Key(3));
  EXPECT_EQ(events[2].key, Key(3));
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(p.num_free() - 1, got).ok());
  EXPECT_EQ(p.FreeListOrder(), std::vector<int32_t>{6});  // key 3 was freed last
  EXPECT_EQ(p.Find(Key(3)), 6);
  m.Check();
}

TEST(MoveCachedTest, RejectsBadInputAndChangesNothing) {
  Memory m(3, {4});
  ASSERT_TRUE(m.Take({8}).ok());  // slabs 0 and 1 full; slab 2 is not the pool's
  BlockPool& p = m.pools[0];
  for (int32_t b : {2, 3, 5})
    ASSERT_TRUE(p.Publish(b, Key(b)).ok());
  // Slab 1 (pages 5-8) empties: its cached page 5 and free page 6 lie in a slab holding nothing.
  m.Drop(0, [&](size_t i) { return m.held[0][i] >= 5 || m.held[0][i] == 2 || m.held[0][i] == 4; });
  const int32_t cached = 2, uncached = 4, held = 3, idle_cached = 5, idle_free = 6;
  const int32_t dormant = 2 * 4 + 1;
  ASSERT_EQ(p.segment_held(1), 0);
  ExpectRefused(
      m, p, &BlockPool::MoveCached,
      {
          {0, uncached, StatusCode::kInvalidArgument, "the null block"},
          {cached, p.num_blocks(), StatusCode::kInvalidArgument, "out of range"},
          {cached, cached, StatusCode::kInvalidArgument, "both source and destination"},
          {held, uncached, StatusCode::kFailedPrecondition, "is held"},
          {uncached, cached, StatusCode::kFailedPrecondition, "free without identity"},
          {dormant, uncached, StatusCode::kFailedPrecondition, "dormant"},
          {cached, held, StatusCode::kFailedPrecondition, "is held"},
          {cached, dormant, StatusCode::kFailedPrecondition, "does not own"},
          {idle_cached, uncached, StatusCode::kFailedPrecondition, "which holds no block"},
          {cached, idle_free, StatusCode::kFailedPrecondition, "which holds no block"},
      });
}

// A compaction for another class drops only cache older than what that class would evict; the
// younger cached pages of the slabs it empties move with their held pages, keeping their keys and
// their place in the eviction order, so the cheapest slab to empty may cache young pages.
TEST(CompactionTest, OlderThanMovesTheYoungerCacheOfTheSlabsItEmpties) {
  Memory m(4, {4, 1});
  ASSERT_TRUE(m.Take({12, 1}).ok());  // class 0 in slabs 0-2 (pages 1-12), class 1 in slab 3
  for (int32_t b : {2, 8, 12})
    ASSERT_TRUE(m.pools[0].Publish(b, Key(b)).ok());
  const int32_t state = m.held[1][0];
  ASSERT_TRUE(m.pools[1].Publish(state, Key(100, 1)).ok());
  const auto free = [&](size_t p, std::vector<int32_t> blocks) {
    ASSERT_TRUE(m.pools[p].Free(blocks).ok());
    for (int32_t b : blocks)
      std::erase(m.held[p], b);
  };
  // Slab 0 holds page 1, caches young page 2 and has 3 and 4 free; slabs 1 and 2 hold three
  // pages each and cache one old page (8, 12), freed before the state, page 2 after it.
  free(0, {8, 12});
  free(1, {state});
  free(0, {2, 3, 4});
  const uint64_t t = m.pools[1].free_tick(state);
  const uint64_t young_tick = m.pools[0].free_tick(2);
  ASSERT_GT(young_tick, t);

  // A full compaction empties slab 0 too, moving page 1 and dropping young page 2.
  CompactionPlan full;
  ASSERT_TRUE(m.arena.PlanCompaction(m.pools, 0, 10, full).ok());
  ASSERT_EQ(full.slabs, std::vector<int32_t>{0});
  ASSERT_EQ(full.moves.size(), 1u);
  EXPECT_EQ(full.moves[0].src, 1);

  // Bounded by the state's age, slab 0 costs two moves (1 and young 2) into the old pages 8 and
  // 12, oldest first; the young page moves before the held one.
  CompactionPlan plan;
  ASSERT_TRUE(m.arena.PlanCompaction(m.pools, 0, 10, plan, t).ok());
  ASSERT_EQ(plan.slabs, std::vector<int32_t>{0});
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].src, 2);
  EXPECT_EQ(plan.moves[0].dst, 8);
  EXPECT_EQ(plan.moves[1].src, 1);
  EXPECT_EQ(plan.moves[1].dst, 12);

  // Bad plans: a cached page moved after its slab's held pages, an uncached free source.
  const auto with = [&](std::vector<PageMove> moves) {
    CompactionPlan p;
    p.moves = std::move(moves);
    p.slabs = {0};
    return p;
  };
  const PoolState before(m.pools[0]);
  const std::vector<std::pair<CompactionPlan, std::string>> bad = {
      {with({{0, 1, 12}, {0, 2, 8}}), "moves after every held page of slab 0"},
      {with({{0, 3, 8}, {0, 1, 12}}), "caches nothing"},
  };
  for (const auto& [p, says] : bad) {
    const Status s = m.arena.Compact(m.pools, p, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
    EXPECT_TRUE(PoolState(m.pools[0]) == before) << says;
    m.Check();
  }

  ASSERT_TRUE(m.arena.Compact(m.pools, plan, 1).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(0), 1);
  EXPECT_EQ(m.pools[0].Find(Key(2)), 8);  // kept, on its new page
  EXPECT_EQ(m.pools[0].free_tick(8), young_tick);
  EXPECT_EQ(m.pools[0].Find(Key(8)), -1);  // the old cache made room
  EXPECT_EQ(m.pools[0].Find(Key(12)), -1);
  EXPECT_EQ(m.pools[0].ref_count(12), 1);
  EXPECT_EQ(m.pools[1].Find(Key(100, 1)), state);
  const ArenaUsage u = m.arena.Usage(m.pools);
  EXPECT_EQ(u.pages_moved, 2);
  EXPECT_EQ(u.cached_pages_moved, 1);
}

// Class 0 holds every other page of the whole arena: half its memory is stranded and class 1,
// whose page is a whole slab, is refused. Compaction empties half the slabs into the other
// half's free pages and class 1 gets them.
TEST(CompactionTest, EveryOtherPagePatternIsUndoneAndTheOtherClassGetsItsSlabs) {
  Memory m(8, {4, 1});
  ASSERT_TRUE(m.Take({32, 0}).ok());
  for (size_t i = 0; i < m.held[0].size(); i += 4) {  // some identities that must survive
    ASSERT_TRUE(m.pools[0].Publish(m.held[0][i], Key(i)).ok());
  }
  m.Drop(0, [](size_t i) { return i % 2 == 1; });
  m.Check();
  const int64_t before = m.Stranded(0);
  EXPECT_EQ(before, 16);  // four slabs' worth, all unusable by class 1
  EXPECT_EQ(m.Take({0, 1}).code(), StatusCode::kResourceExhausted);

  const CompactionPlan plan = m.Compact(0, 1000);
  m.Check();
  EXPECT_EQ(plan.slabs.size(), 4u);
  EXPECT_EQ(plan.moves.size(), 8u);
  for (const PageMove& mv : plan.moves) {
    EXPECT_EQ(mv.pool, 0);
    EXPECT_EQ(std::count(plan.slabs.begin(), plan.slabs.end(), m.pools[0].segment_of(mv.dst)), 0)
        << "a destination inside a slab being emptied";
    EXPECT_NE(std::count(plan.slabs.begin(), plan.slabs.end(), m.pools[0].segment_of(mv.src)), 0);
  }
  const int64_t after = m.Stranded(0);
  EXPECT_EQ(after, 0);
  EXPECT_LT(after, before);
  for (size_t i = 0; i < m.held[0].size(); i += 2) {
    EXPECT_EQ(m.pools[0].Find(Key(2 * i)), m.held[0][i]) << "identity of page " << 2 * i;
  }
  const ArenaUsage u = m.arena.Usage(m.pools);
  EXPECT_EQ(u.unassigned_slabs, 4);
  EXPECT_EQ(u.slabs_compacted, 4);
  EXPECT_EQ(u.pages_moved, 8);
  EXPECT_EQ(u.classes[0].slabs, 4);
  ASSERT_TRUE(m.Take({0, 4}).ok());
  m.Check();
  RecordProperty("stranded_before", static_cast<int>(before));
  RecordProperty("stranded_after", static_cast<int>(after));
}

TEST(CompactionTest, EmptiesOnlyWholeSlabsFewestHeldFirstWithinTheLimit) {
  Memory m(4, {4});
  ASSERT_TRUE(m.Take({16}).ok());
  // Slab 0 keeps 3 pages, slab 1 keeps 1, slab 2 keeps 2, slab 3 keeps 4 (slab s has pages
  // 4s + 1 to 4s + 4).
  const std::vector<int32_t> drop = {4, 6, 7, 8, 11, 12};
  m.Drop(0, [&](size_t i) { return std::count(drop.begin(), drop.end(), m.held[0][i]) != 0; });
  // Limited to one slab: the one with the fewest held pages, into the fullest slab with room.
  CompactionPlan one = m.Compact(0, 1);
  m.Check();
  ASSERT_EQ(one.slabs.size(), 1u);
  EXPECT_EQ(one.slabs[0], 1);
  ASSERT_EQ(one.moves.size(), 1u);
  EXPECT_EQ(m.pools[0].segment_of(one.moves[0].dst), 0);
  // Now 4 + 4 + 2 held in slabs 0, 2, 3 and 2 free pages: slab 2's two pages have nowhere to go.
  CompactionPlan none = m.Compact(0, 1000);
  EXPECT_TRUE(none.slabs.empty());
  EXPECT_TRUE(none.moves.empty());
  EXPECT_EQ(m.FreeInHeldSlabs(0), 2);
  m.Check();
  // A class whose page is a whole slab has nothing to compact.
  Memory whole(3, {1});
  ASSERT_TRUE(whole.Take({2}).ok());
  whole.Drop(0, [](size_t i) { return i == 0; });
  EXPECT_TRUE(whole.Compact(0, 10).moves.empty());
}

TEST(CompactionTest, PrefersUncachedDestinationsThenTheOldestCached) {
  Memory m(3, {4});
  ASSERT_TRUE(m.Take({12}).ok());
  // Slab 0: pages 1 (cached, freed first) and 2 (cached, freed later) free; slab 1: page 5
  // uncached free; slab 2 holds two pages to move.
  ASSERT_TRUE(m.pools[0].Publish(1, Key(1)).ok());
  ASSERT_TRUE(m.pools[0].Publish(2, Key(2)).ok());
  for (int32_t b : {1, 2, 5, 11, 12}) {
    ASSERT_TRUE(m.pools[0].Free(std::vector<int32_t>{b}).ok());
    std::erase(m.held[0], b);
  }
  const CompactionPlan plan = m.Compact(0, 1);
  m.Check();
  ASSERT_EQ(plan.slabs, std::vector<int32_t>{2});
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].dst, 5);  // uncached first
  EXPECT_EQ(plan.moves[1].dst, 1);  // then the oldest cached
  EXPECT_EQ(m.pools[0].Find(Key(1)), -1);
  EXPECT_EQ(m.pools[0].Find(Key(2)), 2);
}

// A compaction for a class that would otherwise evict a cached page freed at tick T (a state):
// only slabs whose free cached pages were all freed before T are emptied, only uncached pages or
// cache older than T receive the moves, and the emptied slab goes to that class.
TEST(CompactionTest, OlderThanDropsOnlyOlderCacheAndHandsTheSlabToTheClass) {
  Memory m(4, {4, 1});
  ASSERT_TRUE(m.Take({12, 1}).ok());  // class 0 in slabs 0-2 (pages 1-12), class 1 in slab 3
  for (int32_t b : {2, 3, 4, 6, 7, 8, 12})
    ASSERT_TRUE(m.pools[0].Publish(b, Key(b)).ok());
  const int32_t state = m.held[1][0];
  ASSERT_TRUE(m.pools[1].Publish(state, Key(100, 1)).ok());
  const auto free = [&](size_t p, std::vector<int32_t> blocks) {
    ASSERT_TRUE(m.pools[p].Free(blocks).ok());
    for (int32_t b : blocks)
      std::erase(m.held[p], b);
  };
  // Slab 0 holds page 1 and caches 2-4, freed first; slab 2 holds 9 and 10, with 11 uncached and
  // 12 cached, freed first too; then the state; then slab 1's cache (6-8, beside held page 5).
  free(0, {2, 3, 4, 11, 12});
  free(1, {state});
  free(0, {6, 7, 8});
  const uint64_t t = m.pools[1].free_tick(state);
  ASSERT_GT(t, m.pools[0].free_tick(4));
  ASSERT_LT(t, m.pools[0].free_tick(6));

  // Without the bound, slabs 0 and 1 (one held page each) are emptied, slab 1's newer cache
  // dropped with them.
  CompactionPlan any;
  ASSERT_TRUE(m.arena.PlanCompaction(m.pools, 0, 10, any).ok());
  EXPECT_EQ(any.slabs, (std::vector<int32_t>{0, 1}));
  // With it, only slab 0: slab 1 caches newer pages, slab 2's two held pages have room only in
  // pages slab 0 frees, and page 1 moves to uncached page 11.
  CompactionPlan plan;
  ASSERT_TRUE(m.arena.PlanCompaction(m.pools, 0, 10, plan, t).ok());
  ASSERT_EQ(plan.slabs, std::vector<int32_t>{0});
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].src, 1);
  EXPECT_EQ(plan.moves[0].dst, 11);
  EXPECT_TRUE(m.arena.Compact(m.pools, plan, 5).code() == StatusCode::kInvalidArgument);
  m.Check();
  ASSERT_TRUE(m.arena.Compact(m.pools, plan, 1).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(0), 1);  // handed to the states, not back to the shared memory
  EXPECT_EQ(m.arena.num_unassigned(), 0);
  EXPECT_EQ(m.pools[1].num_owned(), 2);
  EXPECT_EQ(m.pools[1].num_free_cached(), 1);  // the state is still cached, beside a free page
  EXPECT_EQ(m.pools[1].Find(Key(100, 1)), state);
  for (int32_t b : {6, 7, 8, 12})
    EXPECT_EQ(m.pools[0].Find(Key(b)), b) << b;
  for (int32_t b : {2, 3, 4})
    EXPECT_EQ(m.pools[0].Find(Key(b)), -1) << b;
  EXPECT_EQ(m.pools[0].ref_count(11), 1);
}

TEST(CompactionTest, CompactRejectsBadPlansAndChangesNothing) {
  Memory m(4, {4, 1});
  ASSERT_TRUE(m.Take({12, 1}).ok());               // class 0 in slabs 0-2, class 1 in slab 3
  m.Drop(0, [](size_t i) { return i % 4 != 0; });  // one held page per class-0 slab
  CompactionPlan good;
  ASSERT_TRUE(m.arena.PlanCompaction(m.pools, 0, 2, good).ok());
  ASSERT_EQ(good.slabs.size(), 2u);
  const int32_t victim = good.slabs[0];
  const int32_t src = good.moves[0].src, dst = good.moves[0].dst;
  const int32_t keeper = m.pools[0].segment_of(dst);
  const int32_t in_victim = victim * 4 + 2;  // a free page of the victim slab
  const int32_t held_elsewhere = keeper * 4 + 1;
  const auto with = [&](std::vector<PageMove> moves, std::vector<int32_t> slabs) {
    CompactionPlan p;
    p.moves = std::move(moves);
    p.slabs = std::move(slabs);
    return p;
  };
  struct Case {
    std::string name;
    CompactionPlan plan;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"destination in the emptied slab", with({{0, src, in_victim}}, {victim}), "being emptied"},
      {"a held page left behind", with({}, {victim}), "but 0 move(s)"},
      {"source outside the listed slabs", with({{0, src, dst}}, {}), "is not listed"},
      {"slab listed twice", with({{0, src, dst}}, {victim, victim}), "listed twice"},
      {"slab out of range", with({}, {9}), "slab 9: expected 0 to 3"},
      {"held destination", with({{0, src, held_elsewhere}}, {victim}), "destination is held"},
      {"free source", with({{0, in_victim, dst}}, {victim}), "the source is free"},
      {"destination of another class", with({{1, 3 * 1 + 1, 1}}, {3}), "not owned by the pool"},
      {"source in another class's slab", with({{1, victim + 1, 1}}, {victim}),
       "is not owned by pool 1"},
      {"pool out of range", with({{5, src, dst}}, {victim}), "pool 5"},
      {"source out of range", with({{0, 99, dst}}, {victim}), "source 99: blocks are 1 to"},
      {"destination out of range", with({{0, src, 99}}, {victim}),
       "destination 99: blocks are 1 to"},
      {"source moved twice", with({{0, src, dst}, {0, src, good.moves[1].dst}}, {victim}),
       "source page is already moved away"},
      {"destination filled twice",
       with({{0, src, dst}, {0, good.moves[1].src, dst}}, {victim, good.slabs[1]}),
       "destination page is already filled"},
  };
  const PoolState before0(m.pools[0]), before1(m.pools[1]);
  for (const Case& c : cases) {
    const Status s = m.arena.Compact(m.pools, c.plan);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.name << ": " << s.message();
    EXPECT_TRUE(PoolState(m.pools[0]) == before0) << c.name;
    EXPECT_TRUE(PoolState(m.pools[1]) == before1) << c.name;
    EXPECT_EQ(m.arena.owner(victim), 0);
    m.Check();  // the validation's marks are clear again
  }
  CompactionPlan out;
  const auto refused = [&](std::span<const BlockPool> pools, int32_t pool, int64_t max_slabs,
                           const std::string& what) {
    const Status s = m.arena.PlanCompaction(pools, pool, max_slabs, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  refused(m.pools, 2, 1, "class 2: expected 0 to 1");
  refused(m.pools, 0, -1, "at most -1 slabs: expected a limit >= 0");
  refused(std::span<const BlockPool>(m.pools).first(1), 0, 1, "1 pools for 2 classes");
  // Pools of another arena: other slab counts, other page counts.
  const Memory fewer_slabs(3, {4, 1}), other_pages(4, {2, 1});
  refused(fewer_slabs.pools, 0, 1, "pool 0 has 3 segments; expected this arena's 4 slabs");
  refused(other_pages.pools, 0, 1, "pool 0 has 2 blocks per segment; expected the 4 pages");
  EXPECT_TRUE(out.moves.empty());
  // The good plan still applies.
  ASSERT_TRUE(m.arena.Compact(m.pools, good).ok());
  m.Check();
  EXPECT_EQ(m.arena.owner(victim), -1);
}

TEST(CompactionTest, CompactRefusesASlabNoClassOwns) {
  Memory m(3, {4});
  ASSERT_TRUE(m.Take({4}).ok());  // one slab; the other two are unassigned
  const int32_t unowned = m.arena.owner(0) < 0 ? 0 : (m.arena.owner(1) < 0 ? 1 : 2);
  ASSERT_LT(m.arena.owner(unowned), 0);
  CompactionPlan plan;
  plan.slabs = {unowned};
  const Status s = m.arena.Compact(m.pools, plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slab " + std::to_string(unowned) + " is not owned by any class"),
            std::string::npos)
      << s.message();
  m.Check();
}

// Random allocation, frees (every other page, random subsets, everything), publication and
// compaction over three classes of 2, 5 and 8 pages per slab. After every call the arena and pool
// invariants hold; identities follow their pages; a compaction without limit leaves its class
// fewer than one slab's worth of free pages in slabs that hold its pages; stranding is measured
// with and without compaction.
TEST(CompactionTest, RandomOperationsKeepInvariantsAndBoundStranding) {
  const std::vector<int32_t> per = {2, 5, 8};
  int64_t worst[2] = {0, 0};
  int64_t compactions = 0, moved = 0, refused[2] = {0, 0};
  for (int with_compaction = 0; with_compaction < 2; ++with_compaction) {
    Memory m(36, per);
    std::mt19937_64 rng(23);
    std::map<int32_t, PrefixKey> key_of;  // identities the test published, by page of class 0
    uint64_t next_key = 0;
    for (int step = 0; step < 5000; ++step) {
      const size_t p = rng() % per.size();
      const int op = static_cast<int>(rng() % 10);
      if (op < 5) {
        std::vector<int64_t> need(per.size(), 0);
        need[p] = 1 + static_cast<int64_t>(rng() % 10);
        const size_t before = m.held[p].size();
        const Status s = m.Take(need);
        if (!s.ok()) {
          ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
          ++refused[with_compaction];
        } else if (p == 0 && rng() % 2 == 0) {
          for (size_t i = before; i < m.held[0].size(); ++i) {
            const PrefixKey k = Key(++next_key);
            ASSERT_TRUE(m.pools[0].Publish(m.held[0][i], k).ok());
            key_of[m.held[0][i]] = k;
          }
        }
      } else if (op < 8 && !m.held[p].empty()) {
        const int mode = static_cast<int>(rng() % 3);
        m.Drop(p, [&](size_t i) {
          return mode == 0 ? i % 2 == 0 : mode == 1 ? rng() % 3 == 0 : true;
        });
      } else if (with_compaction == 1) {
        const int64_t stranded = m.Stranded(p);
        const bool unlimited = rng() % 2 == 0;
        std::map<int32_t, PrefixKey> moved_keys;
        CompactionPlan plan;
        ASSERT_TRUE(
            m.arena.PlanCompaction(m.pools, static_cast<int32_t>(p), unlimited ? 1000 : 1, plan)
                .ok());
        // Keys of class 0 follow their pages.
        for (const PageMove& mv : plan.moves) {
          auto it = key_of.find(mv.src);
          if (it != key_of.end() && m.pools[0].Find(it->second) == mv.src)
            moved_keys[mv.dst] = it->second;
        }
        ASSERT_TRUE(m.arena.Compact(m.pools, plan).ok());
        std::map<int32_t, int32_t> to;
        for (const PageMove& mv : plan.moves)
          to[mv.src] = mv.dst;
        for (int32_t& b : m.held[p]) {
          if (to.count(b) != 0) b = to[b];
        }
        if (p == 0) {
          for (const auto& [b, k] : moved_keys) {
            ASSERT_EQ(m.pools[0].Find(k), b);
            key_of[b] = k;
          }
        }
        compactions += plan.slabs.empty() ? 0 : 1;
        moved += static_cast<int64_t>(plan.moves.size());
        ASSERT_LE(m.Stranded(p), stranded);
        if (unlimited) {
          ASSERT_LT(m.FreeInHeldSlabs(p), per[p]) << "class " << p << " step " << step;
          ASSERT_LT(m.Stranded(p), per[p]);
        }
      }
      m.Check();
      // Every page the test holds is held in its pool.
      for (size_t q = 0; q < per.size(); ++q) {
        for (int32_t b : m.held[q])
          ASSERT_GT(m.pools[q].ref_count(b), 0) << "class " << q << " page " << b;
      }
      int64_t total = 0;
      for (size_t q = 0; q < per.size(); ++q)
        total += m.Stranded(q);
      worst[with_compaction] = std::max(worst[with_compaction], total);
    }
  }
  EXPECT_GT(compactions, 0);
  EXPECT_GT(moved, 0);
  EXPECT_GT(refused[0], 0);
  RecordProperty("max_stranded_without_compaction", static_cast<int>(worst[0]));
  RecordProperty("max_stranded_with_compaction", static_cast<int>(worst[1]));
  RecordProperty("refused_without_compaction", static_cast<int>(refused[0]));
  RecordProperty("refused_with_compaction", static_cast<int>(refused[1]));
}

// Random allocation, frees and publication over two classes, with compactions that drop only
// cache older than a random tick: every page cached at or after that tick keeps its key, its tick
// and its place among the others in the eviction order, and the invariants hold after every call.
TEST(CompactionTest, RandomBoundedCompactionsKeepEveryYoungerCachedPage) {
  const std::vector<int32_t> per = {6, 1};
  Memory m(30, per);
  std::mt19937_64 rng(31);
  uint64_t next_key = 0;
  int64_t compactions = 0, cached_moves = 0;
  for (int step = 0; step < 6000; ++step) {
    const size_t p = rng() % per.size();
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      std::vector<int64_t> need(per.size(), 0);
      need[p] = 1 + static_cast<int64_t>(rng() % (p == 0 ? 8 : 2));
      const size_t before = m.held[p].size();
      const Status s = m.Take(need);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
      } else {
        for (size_t i = before; i < m.held[p].size(); ++i) {
          if (rng() % 4 != 0) {
            ASSERT_TRUE(
                m.pools[p].Publish(m.held[p][i], Key(++next_key, static_cast<int32_t>(p))).ok());
          }
        }
      }
    } else if (op < 8 && !m.held[p].empty()) {
      m.Drop(p, [&](size_t) { return rng() % 3 == 0; });
    } else {
      // A bound between the oldest and the newest cached page of class 0.
      const BlockPool& bp = m.pools[0];
      std::vector<uint64_t> ticks;
      for (int32_t b = bp.NextFree(-1); b >= 0; b = bp.NextFree(b)) {
        if (bp.has_identity(b) && bp.free_tick(b) != 0) ticks.push_back(bp.free_tick(b));
      }
      if (ticks.empty()) continue;
      std::sort(ticks.begin(), ticks.end());
      const uint64_t bound = ticks[rng() % ticks.size()];
      std::vector<std::pair<PrefixKey, uint64_t>> young;  // in eviction order
      for (int32_t b : bp.FreeListOrder()) {
        if (bp.has_identity(b) && bp.free_tick(b) >= bound)
          young.emplace_back(bp.identity(b), bp.free_tick(b));
      }
      CompactionPlan plan;
      ASSERT_TRUE(
          m.arena.PlanCompaction(m.pools, 0, 1 + static_cast<int64_t>(rng() % 3), plan, bound)
              .ok());
      ASSERT_TRUE(m.arena.Compact(m.pools, plan, 1).ok()) << "step " << step;
      std::map<int32_t, int32_t> to;
      for (const PageMove& mv : plan.moves)
        to[mv.src] = mv.dst;
      for (int32_t& b : m.held[0]) {
        if (to.count(b) != 0) b = to[b];
      }
      const int64_t before = cached_moves;
      cached_moves = m.arena.Usage(m.pools).cached_pages_moved;
      compactions += plan.slabs.empty() ? 0 : 1;
      std::vector<std::pair<PrefixKey, uint64_t>> after;
      for (int32_t b : bp.FreeListOrder()) {
        if (bp.has_identity(b) && bp.free_tick(b) >= bound)
          after.emplace_back(bp.identity(b), bp.free_tick(b));
      }
      ASSERT_EQ(after.size(), young.size())
          << "step " << step << ", " << cached_moves - before << " cached pages moved";
      for (size_t i = 0; i < young.size(); ++i) {
        ASSERT_TRUE(after[i].first == young[i].first) << "step " << step << " entry " << i;
        ASSERT_EQ(after[i].second, young[i].second) << "step " << step << " entry " << i;
      }
    }
    m.Check();
    for (size_t q = 0; q < per.size(); ++q) {
      for (int32_t b : m.held[q])
        ASSERT_GT(m.pools[q].ref_count(b), 0) << "class " << q << " page " << b;
    }
  }
  EXPECT_GT(compactions, 0);
  EXPECT_GT(cached_moves, 0);
  RecordProperty("compactions", static_cast<int>(compactions));
  RecordProperty("cached_pages_moved", static_cast<int>(cached_moves));
}

}  // namespace
}  // namespace hkv
