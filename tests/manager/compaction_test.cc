// KvCacheManager::Compact: stranded token and state pages of two-level memory move into the
// free pages of fuller slabs, every reference follows them (tables shared by forks, live and
// rolling states, the prefix index), and the emptied slabs serve another class. Driven through
// the content-tracking FakeEngine, which copies each moved page and poisons its old place, so a
// reference the manager failed to rewrite reads poison; it also checks the invariants, the events
// and that refused calls change nothing after every call.
#include <algorithm>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include <hkv/manager/compaction_policy.h>

#include "fake_engine.h"
#include "manager_test_util.h"

namespace hkv {
namespace {

using testing::EngineRequest;
using testing::FakeEngine;
using testing::Full;
using testing::MakeConfig;
using testing::Seq;
using testing::StateGroup;

// Token pages of 4 tokens (`token_per` to a slab) and recurrent states (`state_per` to a slab).
ManagerConfig TwoLevel(int64_t slabs, int32_t token_per, int32_t state_per, bool caching) {
  ManagerConfig c = MakeConfig(
      {static_cast<int32_t>(slabs * token_per + 1), static_cast<int32_t>(slabs * state_per + 1)},
      {Full(4, 0), StateGroup(1)});
  c.arena.num_slabs = slabs;
  c.arena.pages_per_slab = {token_per, state_per};
  c.enable_prefix_caching = caching;
  return c;
}

// Engine-side helpers: every call goes through the FakeEngine and must succeed.
class Scenario {
 public:
  explicit Scenario(KvCacheManager& m) : e_(m) {}
  FakeEngine& e() { return e_; }

  void Add(RequestId id, std::vector<int32_t> prompt) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    ASSERT_TRUE(e_.Add(r).ok());
    ASSERT_TRUE(e_.Lookup(id).ok());
  }
  // Allocates, runs and commits one step of n tokens.
  void Step(RequestId id, int64_t n) {
    const Status s = e_.Allocate(id, n);
    ASSERT_TRUE(s.ok()) << s.ToString();
    e_.Run();
    ASSERT_TRUE(e_.Commit(id, e_.Find(id)->step->end).ok());
  }
  void Prefill(RequestId id) {
    const FakeEngine::Seq* q = e_.Find(id);
    Step(id, q->known - q->hit.tokens);
  }
  // n more known tokens, then computed.
  void Decode(RequestId id, int32_t n) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i)
      t.push_back(static_cast<int32_t>(500 + 37 * id + static_cast<RequestId>(i)));
    ASSERT_TRUE(e_.Append(id, t).ok());
    Step(id, n);
  }
  std::vector<int32_t> Table(KvCacheManager& m, RequestId id) {
    auto t = m.BlockTable(id, 0).value();
    return {t.begin(), t.end()};
  }
  void ExpectClean() {
    e_.AuditAll();
    ASSERT_FALSE(e_.failed()) << e_.Report();
  }

 private:
  FakeEngine e_;
};

// Two requests decode in turn, one token page each step, so their pages alternate inside every
// token slab; then one ends. Half of every token slab is free but no other class can use it.
void Interleave(Scenario& run, RequestId a, RequestId b, int rounds) {
  run.Add(a, Seq(4, 1000));
  run.Add(b, Seq(4, 2000));
  run.Prefill(a);
  run.Prefill(b);
  for (int i = 0; i < rounds; ++i) {
    run.Decode(a, 4);
    run.Decode(b, 4);
  }
}

// Interleave, then request 2 ends: 8 token pages stranded, half of every token slab.
void StrandHalfOfEveryTokenSlab(KvCacheManager& m, Scenario& run) {
  Interleave(run, 1, 2, 7);
  ASSERT_TRUE(run.e().Free(2).ok());
  ASSERT_EQ(m.Arena().classes[0].stranded_pages, 8);
}

TEST(CompactTest, EveryOtherPageRefusedThenCompactedThenAllocated) {
  // 6 slabs: 4 of token pages (4 each), 2 of states (1 each); no prefix caching, so freed pages
  // are plain stranded memory.
  Result<KvCacheManager> made = KvCacheManager::Create(TwoLevel(6, 4, 1, false));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  Scenario run(m);
  Interleave(run, 1, 2, 7);
  ASSERT_EQ(m.Arena().unassigned_slabs, 0);
  ASSERT_TRUE(run.e().Free(2).ok());
  EXPECT_EQ(m.Arena().classes[0].stranded_pages, 8);  // two slabs' worth in four slabs
  // Request 3 fits (a stranded page and request 2's state slab); request 4 needs a second state
  // slab and the token pages hold all the others.
  run.Add(3, Seq(4, 3000));
  run.Prefill(3);
  run.Add(4, Seq(4, 4000));
  const Status refused = run.e().Allocate(4, 4);
  ASSERT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  const int64_t before = m.Arena().classes[0].stranded_pages;

  Result<CompactionResult> c = run.e().Compact(100);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  EXPECT_EQ(c->slabs.size(), 1u);
  EXPECT_EQ(c->moves.size(), 2u);
  for (const PageMove& mv : c->moves)
    EXPECT_EQ(mv.pool, 0);
  const ArenaUsage after = m.Arena();
  EXPECT_LT(after.classes[0].stranded_pages, before);
  EXPECT_LT(after.classes[0].stranded_pages, 4);  // less than one slab's worth
  EXPECT_EQ(after.unassigned_slabs, 1);
  EXPECT_EQ(after.slabs_compacted, 1);
  EXPECT_EQ(after.pages_moved, 2);
  RecordProperty("stranded_before", static_cast<int>(before));
  RecordProperty("stranded_after", static_cast<int>(after.classes[0].stranded_pages));

  // The returned slab becomes request 4's state; everyone reads what they wrote (the last two
  // free token pages go to two more decode steps).
  run.Step(4, 4);
  for (RequestId id : {1, 4})
    run.Decode(id, 4);
  run.ExpectClean();
  for (RequestId id : {1, 3, 4})
    ASSERT_TRUE(run.e().Free(id).ok());
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
}

// Per-class limits: a class given 0 is left alone (its cached pages stay), and limits of the
// wrong count or sign are refused with nothing changed.
TEST(CompactTest, PerClassLimitsLeaveOtherClassesAloneAndBadLimitsAreRefused) {
  Result<KvCacheManager> made = KvCacheManager::Create(TwoLevel(6, 4, 1, false));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  Scenario run(m);
  ASSERT_NO_FATAL_FAILURE(StrandHalfOfEveryTokenSlab(m, run));
  const int64_t stranded = m.Arena().classes[0].stranded_pages;
  EXPECT_EQ(m.Usage(0).num_stranded, stranded);
  EXPECT_GE(m.Usage(0).num_free_in_held_slabs, stranded);

  const std::vector<int64_t> one = {100}, negative = {-1, 100};
  const Result<CompactionResult> wrong_count = m.Compact(one);
  EXPECT_EQ(wrong_count.status().code(), StatusCode::kInvalidArgument);
  const Result<CompactionResult> wrong_sign = m.Compact(negative);
  EXPECT_EQ(wrong_sign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_sign.status().message().find("class 0"), std::string::npos)
      << wrong_sign.status().message();
  const std::vector<int64_t> states_only = {0, 100};
  const Result<CompactionResult> untouched = m.Compact(states_only);
  ASSERT_TRUE(untouched.ok()) << untouched.status().ToString();
  EXPECT_TRUE(untouched->moves.empty());
  EXPECT_EQ(m.Arena().classes[0].stranded_pages, stranded);
  EXPECT_EQ(m.Arena().slabs_compacted, 0);
  ASSERT_TRUE(m.CheckInvariants().ok());

  const std::vector<int64_t> tokens_only = {100, 0};
  Result<CompactionResult> c = m.Compact(tokens_only);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->slabs.empty());
  EXPECT_LT(m.Arena().classes[0].stranded_pages, 4);
  ASSERT_TRUE(m.CheckInvariants().ok());
}

// CompactFor works only for a class about to evict one of its cached pages: without prefix
// caching no state page caches anything, so it empties nothing, while Compact would. A bad class
// is refused and changes nothing.
TEST(CompactTest, CompactForOnlyServesAClassThatWouldEvictCache) {
  Result<KvCacheManager> made = KvCacheManager::Create(TwoLevel(6, 4, 1, false));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  Scenario run(m);
  ASSERT_NO_FATAL_FAILURE(StrandHalfOfEveryTokenSlab(m, run));
  ASSERT_GT(m.Usage(1).num_free, 0);
  EXPECT_EQ(m.Usage(1).num_free_cached, 0);
  const int64_t stranded = m.Arena().classes[0].stranded_pages;

  const std::vector<int64_t> tokens = {100, 0};
  for (int32_t bad : {-1, 2}) {
    const Result<CompactionResult> r = m.CompactFor(bad, tokens);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("class " + std::to_string(bad)), std::string::npos)
        << r.status().message();
  }
  const Result<CompactionResult> none = run.e().CompactFor(1, tokens);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->slabs.empty());
  EXPECT_EQ(m.Arena().classes[0].stranded_pages, stranded);
  EXPECT_EQ(m.Arena().slabs_compacted, 0);
  const Result<CompactionResult> plain = run.e().Compact(tokens);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->slabs.empty());
  run.ExpectClean();
}

// CompactionDue for token pages that mostly cache. Requests 9, 7 and 8 end first; four requests
// then fill two token slabs (evicting the first ones' token pages) and two state slabs (four
// states to a slab), and two
// of them end. Half the token pages are free and all cache something, so the next token page
// would evict; the states have free pages beside the running ones, some caching nothing (the
// state class evicts nothing), and 9's final state is older than every cached token page. The
// token class is due; the cheapest state slab is emptied for it, its running state moved onto
// 9's (the only cache older than what the tokens would evict), and the running requests go on
// reading their states where compaction put them. Without 7 and 8 ending first, 9's state is not
// old enough for the margin; with the token pages mostly held the compaction is not due.
TEST(CompactTest, TokenPagesMostlyCachingTakeAStateSlab) {
  ManagerConfig config = TwoLevel(4, 4, 4, true);
  config.prompt_checkpoints = false;  // states only where requests end (and branch)
  Result<KvCacheManager> made = KvCacheManager::Create(config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  // Request 9 runs and ends, then 7 and 8 (whose ends age 9's state), then 1-4 run.
  const auto fill = [](Scenario& r, bool age_nine = true) {
    r.Add(9, Seq(8, 9000));
    r.Prefill(9);
    ASSERT_TRUE(r.e().Free(9).ok());
    for (RequestId id : {7, 8}) {
      if (!age_nine) break;
      r.Add(id, Seq(16, static_cast<int32_t>(1000 * id)));
      r.Prefill(id);
      ASSERT_TRUE(r.e().Free(id).ok());
    }
    for (RequestId id = 1; id <= 4; ++id) {
      r.Add(id, Seq(8, static_cast<int32_t>(1000 * id)));
      r.Prefill(id);
    }
  };
  Scenario run(m);
  ASSERT_NO_FATAL_FAILURE(fill(run));
  ASSERT_EQ(m.Arena().unassigned_slabs, 0);
  std::vector<int64_t> limits;
  int32_t for_pool = -2;
  EXPECT_FALSE(CompactionDue(m, false, limits, for_pool));  // no token page free yet
  ASSERT_TRUE(run.e().Free(1).ok());
  ASSERT_TRUE(run.e().Free(3).ok());
  const PoolUsage tokens = m.Usage(0), states = m.Usage(1);
  ASSERT_EQ(tokens.num_free, tokens.num_free_cached);
  ASSERT_GE(tokens.num_free, kCacheShareForSlabs * tokens.num_blocks);
  ASSERT_GT(states.num_free, states.num_free_cached);  // the states evict nothing yet
  ASSERT_GE(states.num_free_in_held_slabs, 4);

  ASSERT_TRUE(CompactionDue(m, false, limits, for_pool));
  EXPECT_EQ(for_pool, 0);
  EXPECT_EQ(limits, (std::vector<int64_t>{0, 4}));
  Result<CompactionResult> c = run.e().CompactFor(for_pool, limits);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  ASSERT_EQ(c->slabs.size(), 1u);
  for (const PageMove& mv : c->moves)
    EXPECT_EQ(mv.pool, 1);
  EXPECT_EQ(m.Usage(0).num_blocks, tokens.num_blocks + 4);  // the emptied slab went to the tokens
  EXPECT_EQ(m.Usage(1).num_blocks, states.num_blocks - 4);

  // The running requests decode into the new token pages, reading their states where compaction
  // put them (the FakeEngine checks every read against what was written).
  for (RequestId id : {2, 4})
    run.Decode(id, 4);
  run.ExpectClean();

  // Without 7 and 8, 9's state is older than the token page that would be evicted, but not
  // KvCacheManager::kCacheAgeMargin times as old: the compaction is due and empties nothing, so
  // near the balance of the two classes' ages no slab goes back and forth.
  {
    Result<KvCacheManager> near_made = KvCacheManager::Create(config);
    ASSERT_TRUE(near_made.ok()) << near_made.status().ToString();
    KvCacheManager& near = *near_made;
    Scenario near_run(near);
    ASSERT_NO_FATAL_FAILURE(fill(near_run, false));
    ASSERT_TRUE(near_run.e().Free(1).ok());
    ASSERT_TRUE(near_run.e().Free(3).ok());
    ASSERT_TRUE(CompactionDue(near, false, limits, for_pool));
    ASSERT_EQ(for_pool, 0);
    Result<CompactionResult> none = near_run.e().CompactFor(for_pool, limits);
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_TRUE(none->slabs.empty());
    near_run.ExpectClean();
  }

  // The same with only request 1 ended: a quarter of the token pages free, all caching. The token
  // class would evict, but most of its memory serves running requests: not due.
  Result<KvCacheManager> busy_made = KvCacheManager::Create(config);
  ASSERT_TRUE(busy_made.ok()) << busy_made.status().ToString();
  KvCacheManager& busy = *busy_made;
  Scenario busy_run(busy);
  ASSERT_NO_FATAL_FAILURE(fill(busy_run));
  ASSERT_TRUE(busy_run.e().Free(1).ok());
  const PoolUsage held_tokens = busy.Usage(0);
  ASSERT_EQ(held_tokens.num_free, held_tokens.num_free_cached);
  ASSERT_GT(held_tokens.num_free, 0);
  ASSERT_LT(held_tokens.num_free, kCacheShareForSlabs * held_tokens.num_blocks);
  ASSERT_GT(busy.Usage(1).num_free, busy.Usage(1).num_free_cached);
  EXPECT_FALSE(CompactionDue(busy, false, limits, for_pool));
  EXPECT_EQ(for_pool, -1);
  busy_run.ExpectClean();
}

TEST(CompactTest, SharedPagesAndStatesFollowTheirMoves) {
  // States two to a slab, so they strand too; prefix caching on, so moved pages carry identities.
  Result<KvCacheManager> made = KvCacheManager::Create(TwoLevel(16, 4, 2, true));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  Scenario run(m);
  Interleave(run, 1, 2, 7);
  ASSERT_TRUE(run.e().Fork(1, 11).ok());  // request 1's pages and states, shared
  // Four one-page requests fill two state slabs; the second and fourth end, and the first and
  // third are forked, so whichever state moves is named by two requests.
  for (RequestId id = 20; id < 24; ++id) {
    run.Add(id, Seq(4, static_cast<int32_t>(100 * id)));
    run.Prefill(id);
  }
  ASSERT_TRUE(run.e().Fork(20, 30).ok());
  ASSERT_TRUE(run.e().Fork(22, 32).ok());
  ASSERT_TRUE(run.e().Free(21).ok());
  ASSERT_TRUE(run.e().Free(23).ok());
  ASSERT_TRUE(run.e().Free(2).ok());  // every other token page of request 1's slabs
  const std::vector<int32_t> table1 = run.Table(m, 1);
  ASSERT_EQ(run.Table(m, 11), table1);

  Result<CompactionResult> c = run.e().Compact(100);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  std::map<int32_t, int32_t> token_moves;
  int64_t state_moves = 0;
  for (const PageMove& mv : c->moves) {
    if (mv.pool == 0) token_moves[mv.src] = mv.dst;
    state_moves += mv.pool == 1 ? 1 : 0;
  }
  EXPECT_GE(state_moves, 1);
  // Both tables that shared request 1's pages name the new pages, and still the same ones.
  int64_t moved = 0;
  std::vector<int32_t> want = table1;
  for (int32_t& b : want) {
    if (token_moves.count(b) != 0) {
      b = token_moves[b];
      ++moved;
    }
  }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(run.Table(m, 1), want);
  EXPECT_EQ(run.Table(m, 11), want);

  // Live and rolling states were rewritten: the forked requests step from their live state, and
  // one of them rolls back onto its rolling state (at 4 tokens, after one more token).
  for (RequestId id : {1, 11, 20, 30, 22, 32})
    run.Decode(id, 1);
  ASSERT_TRUE(run.e().Truncate(30, 4).ok());
  ASSERT_TRUE(run.e().Truncate(32, 4).ok());
  for (RequestId id : {30, 32})
    run.Decode(id, 4);
  run.ExpectClean();
  for (RequestId id : {1, 11, 20, 30, 22, 32})
    ASSERT_TRUE(run.e().Free(id).ok());
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(CompactTest, CachedIdentitiesFollowTheirPages) {
  // Two token groups of 4- and 8-token blocks, 4 and 2 pages to a slab: the prefix index maps
  // every key of a moved page to its new page, so a later Lookup hits through it.
  ManagerConfig config = MakeConfig({8 * 4 + 1, 8 * 2 + 1}, {Full(4, 0), Full(8, 1)});
  config.arena.num_slabs = 8;
  config.arena.pages_per_slab = {4, 2};
  Result<KvCacheManager> made = KvCacheManager::Create(config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvCacheManager& m = *made;
  Scenario run(m);
  run.Add(1, Seq(8, 1000));
  run.Add(2, Seq(8, 2000));
  run.Prefill(1);
  run.Prefill(2);
  for (int i = 0; i < 3; ++i) {
    run.Decode(1, 8);
    run.Decode(2, 8);
  }
  ASSERT_TRUE(run.e().Free(2).ok());
  Result<CompactionResult> c = run.e().Compact(100);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  ASSERT_FALSE(c->moves.empty());
  std::map<int32_t, int32_t> moved_to[2];
  for (const PageMove& mv : c->moves)
    moved_to[mv.pool][mv.dst] = mv.src;
  EXPECT_FALSE(moved_to[0].empty());
  EXPECT_FALSE(moved_to[1].empty());
  // Request 1's tokens come back: the hit covers every aligned block and reads the pages where
  // compaction put them (the FakeEngine verifies what it reads).
  const FakeEngine::Seq* q1 = run.e().Find(1);
  run.Add(3, std::vector<int32_t>(q1->tokens.begin(), q1->tokens.begin() + q1->known));
  EXPECT_EQ(run.e().Find(3)->hit.tokens, 24);
  run.Prefill(3);
  for (int32_t g = 0; g < 2; ++g) {
    auto table = m.BlockTable(3, g).value();
    EXPECT_TRUE(std::any_of(table.begin(), table.end(),
                            [&](int32_t b) { return moved_to[g].count(b) != 0; }))
        << "group " << g << " hit no moved page";
  }
  run.ExpectClean();
}

TEST(CompactTest, RefusedWhileAStepIsOpenAndChangesNothing) {
  Result<KvCacheManager> made = KvCacheManager::Create(TwoLevel(6, 4, 1, false));
  ASSERT_TRUE(made.ok());
  KvCacheManager& m = *made;
  Scenario run(m);
  Interleave(run, 1, 2, 7);
  ASSERT_TRUE(run.e().Free(2).ok());
  ASSERT_TRUE(run.e().Append(1, std::vector<int32_t>{7}).ok());
  ASSERT_TRUE(run.e().Allocate(1, 1).ok());  // open
  const ArenaUsage before = m.Arena();
  const std::vector<int32_t> table = run.Table(m, 1);
  // The FakeEngine expects the refusal and checks that usage, free lists and events are as
  // before.
  Result<CompactionResult> c = run.e().Compact(100);
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("request 1 has an open step"), std::string::npos)
      << c.status().message();
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
  EXPECT_EQ(m.Arena().classes[0].stranded_pages, before.classes[0].stranded_pages);
  EXPECT_EQ(m.Arena().slabs_compacted, 0);
  EXPECT_EQ(run.Table(m, 1), table);
  EXPECT_EQ(m.Compact(0).status().code(), StatusCode::kInvalidArgument);
  // Once the step is committed, compaction goes ahead.
  run.e().Run();
  ASSERT_TRUE(run.e().Commit(1, run.e().Find(1)->step->end).ok());
  c = run.e().Compact(1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->slabs.size(), 1u);
  run.Decode(1, 4);
  run.ExpectClean();
}

TEST(CompactTest, IsANoOpWithoutTwoLevelMemory) {
  Result<KvCacheManager> made =
      KvCacheManager::Create(MakeConfig({20, 5}, {Full(4, 0), StateGroup(1)}));
  ASSERT_TRUE(made.ok());
  KvCacheManager& m = *made;
  Scenario run(m);
  Interleave(run, 1, 2, 3);
  ASSERT_TRUE(run.e().Free(2).ok());
  // The FakeEngine checks that nothing changed and no event was emitted.
  Result<CompactionResult> c = run.e().Compact(100);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->moves.empty());
  EXPECT_TRUE(c->slabs.empty());
  EXPECT_EQ(m.Arena().num_slabs, 0);
  ASSERT_FALSE(run.e().failed()) << run.e().Report();
}

}  // namespace
}  // namespace hkv
