// Checkpoint retention: checkpoints that can no longer be the best hit for their prefix are
// demoted (still hittable, first to be evicted); the rest keep their LRU place.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

constexpr int32_t kStatePool = 1;

// These tests prefill a whole prompt in one step and follow every checkpoint it passes: an
// engine that splits a chunk as often as needed (the default cap of 2 is tested below).
ManagerConfig Hybrid(int64_t interval, int32_t cap) {
  ManagerConfig c = MakeConfig({256, 64}, {Full(4, 0), StateGroup(kStatePool)});
  c.checkpoint_interval = interval;
  c.max_interval_checkpoints = cap;
  c.max_state_splits = 16;
  return c;
}

// Positions the step snapshots (the chunk's splits) for a 30-token prompt prefilled at once with
// 4-token alignment and an interval of 8.
std::vector<int64_t> SplitsOfOneStep(int32_t max_state_splits) {
  ManagerConfig c = Hybrid(8, 0);
  c.max_state_splits = max_state_splits;
  Driver d(c);
  d.Add(1, Seq(30));
  EXPECT_TRUE(d.m().Allocate(1, 30).ok());
  const Result<StateStep> st = d.m().State(1, 1);
  EXPECT_TRUE(st.ok());
  std::vector<int64_t> out;
  if (!st.ok()) return out;
  for (const StateSnapshot& s : st->snapshots)
    out.push_back(s.position);
  return out;
}

TEST(CheckpointRetention, SplitsPerStepAreCappedKeepingTheMostUseful) {
  // Candidates: the prompt's end (28, also the rolling state) and the intervals 8, 16, 24.
  EXPECT_EQ(SplitsOfOneStep(16), (std::vector<int64_t>{8, 16, 24, 28}));
  // Two splits: the prompt's end, then the newest interval.
  EXPECT_EQ(SplitsOfOneStep(2), (std::vector<int64_t>{24, 28}));
  EXPECT_EQ(SplitsOfOneStep(1), (std::vector<int64_t>{28}));
  EXPECT_TRUE(SplitsOfOneStep(0).empty());
  ManagerConfig bad = Hybrid(8, 0);
  bad.max_state_splits = -1;
  const Result<KvCacheManager> m = KvCacheManager::Create(bad);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("max_state_splits -1"), std::string::npos);
}

// Blocks of the state pool that the calls since the last look were published into, in order.
std::vector<int32_t> NewCheckpoints(Driver& d) {
  std::vector<int32_t> out;
  for (const ManagerEvent& e : d.m().TakeEvents()) {
    if (e.kind == KvEvent::Kind::kStored && e.pool == kStatePool) out.push_back(e.block);
  }
  return out;
}

// Where a block stands in the state pool's eviction order (-1: not free).
int64_t Rank(Driver& d, int32_t block) {
  const std::vector<int32_t> order = ManagerProbe::FreeListOrder(d.m(), kStatePool);
  const auto it = std::find(order.begin(), order.end(), block);
  return it == order.end() ? -1 : it - order.begin();
}

// A request on other tokens whose final checkpoint is freed first: in LRU order everything
// freed later queues behind it; a demoted checkpoint goes ahead of it.
int32_t FreeAMarker(Driver& d, RequestId id) {
  NewCheckpoints(d);
  d.Add(id, Seq(9, 5000));
  d.Prefill(id);
  const std::vector<int32_t> published = NewCheckpoints(d);  // its prompt's end, at 8, last
  EXPECT_FALSE(published.empty());
  d.Free(id);
  EXPECT_TRUE(NewCheckpoints(d).empty());
  return published.empty() ? -1 : published.back();
}

TEST(CheckpointRetention, AtFreeOnlyTheFinalStateKeepsItsPlace) {
  Driver d(Hybrid(8, 0));
  const int32_t marker = FreeAMarker(d, 99);
  d.Add(1, Seq(30));
  d.Prefill(1);
  // Interval checkpoints 8, 16, 24 and the prompt's end, 28.
  const std::vector<int32_t> prompt = NewCheckpoints(d);
  ASSERT_EQ(prompt.size(), 4u);
  for (int32_t t = 0; t < 7; ++t)
    d.Decode(1, 900 + t);  // to 37 tokens: an interval checkpoint at 32, rolling at 36
  const std::vector<int32_t> decode = NewCheckpoints(d);
  ASSERT_EQ(decode.size(), 1u);
  d.Free(1);
  const std::vector<int32_t> final_state = NewCheckpoints(d);  // the rolling state, at 36
  ASSERT_EQ(final_state.size(), 1u);
  const int64_t marker_rank = Rank(d, marker);
  for (int32_t b : prompt) {
    EXPECT_LT(Rank(d, b), marker_rank) << "block " << b << " should have been demoted";
  }
  EXPECT_LT(Rank(d, decode[0]), marker_rank);
  EXPECT_GT(Rank(d, final_state[0]), marker_rank);
  // Demoted, not dropped: while memory lasts they still serve shorter shared prefixes.
  d.Add(2, Concat(Seq(26), Seq(10, 700)));
  EXPECT_EQ(d.Lookup(2).tokens, 24);
  // The next turn hits the final state.
  d.Add(3, Concat(Concat(Seq(30), Seq(7, 900)), Seq(5, 50)));
  EXPECT_EQ(d.Lookup(3).tokens, 36);
  ASSERT_TRUE(d.m().Free(2).ok());
  ASSERT_TRUE(d.m().Free(3).ok());
  d.Check();
}

TEST(CheckpointRetention, WithoutDemotionEveryCheckpointKeepsItsLruPlace) {
  ManagerConfig c = Hybrid(8, 0);
  c.demote_superseded_checkpoints = false;
  Driver d(c);
  const int32_t marker = FreeAMarker(d, 99);
  d.Add(1, Seq(30));
  d.Prefill(1);
  const std::vector<int32_t> prompt = NewCheckpoints(d);
  ASSERT_EQ(prompt.size(), 4u);
  for (int32_t t = 0; t < 7; ++t)
    d.Decode(1, 900 + t);
  d.Free(1);
  for (int32_t b : prompt)
    EXPECT_GT(Rank(d, b), Rank(d, marker));
}

TEST(CheckpointRetention, TheDivergencePointIsABranchAndKeepsItsPlace) {
  Driver d(Hybrid(0, 0));
  const std::vector<int32_t> system = Seq(16, 100);
  d.Add(1, Concat(system, Seq(9, 1000)));
  d.Prefill(1);
  d.Free(1);
  const int32_t marker = FreeAMarker(d, 99);
  NewCheckpoints(d);
  d.Add(2, Concat(system, Seq(9, 2000)));
  d.Prefill(2);  // computes from 0: the state at 16 (where it diverges) and at 24 (prompt end)
  const std::vector<int32_t> published = NewCheckpoints(d);
  ASSERT_EQ(published.size(), 2u);
  for (int32_t t = 0; t < 9; ++t)
    d.Decode(2, 900 + t);  // to 34 tokens: rolling at 32
  d.Free(2);
  EXPECT_GT(Rank(d, published[0]), Rank(d, marker)) << "the divergence checkpoint was demoted";
  EXPECT_LT(Rank(d, published[1]), Rank(d, marker)) << "the prompt's end should be demoted";
  d.Add(3, Concat(system, Seq(9, 3000)));
  EXPECT_EQ(d.Lookup(3).tokens, 16);
}

// Admission by expected reuse (prompt_checkpoints off): the prompt's end is not checkpointed, so
// a request that decodes past it leaves no state there, and an identical prompt misses once. That
// second request finds the prompt's attention cached and checkpoints its branch point, which the
// third one hits. With prompt checkpoints on, the second already hits the prompt's end.
TEST(CheckpointRetention, WithoutPromptCheckpointsAPromptSeenTwiceIsCheckpointedAtItsBranch) {
  for (const bool prompt_checkpoints : {false, true}) {
    ManagerConfig c = Hybrid(0, 0);
    c.prompt_checkpoints = prompt_checkpoints;
    Driver d(c);
    const std::vector<int32_t> prompt = Seq(27, 100);
    d.Add(1, prompt);
    d.Prefill(1);
    NewCheckpoints(d);
    for (int32_t t = 0; t < 9; ++t)
      d.Decode(1, 900 + t);  // to 36 tokens: the final state at 36
    d.Free(1);
    d.Add(2, prompt);
    if (prompt_checkpoints) {
      EXPECT_EQ(d.Lookup(2).tokens, 24);
      continue;
    }
    EXPECT_EQ(d.Lookup(2).tokens, 0) << "no state at the prompt's end (24) was admitted";
    NewCheckpoints(d);
    d.Prefill(2);
    EXPECT_EQ(NewCheckpoints(d).size(), 1u);  // the branch point, 24 (also its rolling state)
    d.Free(2);
    d.Add(3, prompt);
    EXPECT_EQ(d.Lookup(3).tokens, 24);
    d.Check();
  }
}

TEST(CheckpointRetention, ARunningRequestKeepsItsNewestIntervalCheckpoints) {
  Driver d(Hybrid(4, 2));
  const int32_t marker = FreeAMarker(d, 99);
  d.Add(1, Seq(5));
  d.Prefill(1);  // the prompt's end is at 4
  NewCheckpoints(d);
  std::vector<int32_t> at;  // at[k]: the checkpoint at 4 * (k + 2)
  for (int32_t t = 0; t < 24; ++t) {
    d.Decode(1, 900 + t);  // to 29 tokens
    const std::vector<int32_t> b = NewCheckpoints(d);
    at.insert(at.end(), b.begin(), b.end());
  }
  ASSERT_EQ(at.size(), 6u);  // 8, 12, ..., 28
  const int64_t marker_rank = Rank(d, marker);
  for (size_t k = 0; k + 2 < at.size(); ++k) {
    EXPECT_LT(Rank(d, at[k]), marker_rank) << "checkpoint at " << 4 * (k + 2);
  }
  // The newest two, at 24 and 28, keep their LRU place.
  EXPECT_GT(Rank(d, at[4]), marker_rank);
  EXPECT_GT(Rank(d, at[5]), marker_rank);
  d.Free(1);
  EXPECT_LT(Rank(d, at[4]), Rank(d, marker));  // superseded by the final state now
}

TEST(CheckpointRetention, AForkDemotesOnlyWhatItPublishedItself) {
  Driver d(Hybrid(8, 0));
  const int32_t marker = FreeAMarker(d, 99);
  d.Add(1, Seq(20));
  d.Prefill(1);  // 8 and 16 (also the prompt's end)
  const std::vector<int32_t> parent = NewCheckpoints(d);
  ASSERT_EQ(parent.size(), 2u);
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Check();
  for (int32_t t = 0; t < 10; ++t)
    d.Decode(2, 900 + t);  // the child to 30 tokens: 24 (interval), rolling at 28
  const std::vector<int32_t> child = NewCheckpoints(d);
  ASSERT_EQ(child.size(), 1u);
  d.Free(2);
  EXPECT_GT(Rank(d, parent[0]), Rank(d, marker));
  EXPECT_GT(Rank(d, parent[1]), Rank(d, marker));
  EXPECT_LT(Rank(d, child[0]), Rank(d, marker));
  d.Free(1);
}

TEST(CheckpointRetention, DemotedCheckpointsAreEvictedBeforeOthers) {
  ManagerConfig c = Hybrid(8, 0);
  c.pool_blocks = {256, 9};  // 8 state blocks
  Driver d(c);
  d.Add(1, Seq(30));
  d.Prefill(1);  // 8, 16, 24, 28 published and freed
  for (int32_t t = 0; t < 7; ++t)
    d.Decode(1, 900 + t);  // 32 published; rolling 36 and live 37 held
  d.Free(1);               // 36 kept, the rest demoted
  EXPECT_EQ(d.m().Usage(kStatePool).num_cached, 6);
  // A request on other tokens takes 5 state blocks (a write slot and 4 snapshots): the two
  // uncached blocks go first, then three demoted checkpoints; the final state survives.
  d.Add(2, Seq(33, 7000));
  d.Prefill(2);
  d.Add(3, Concat(Concat(Seq(30), Seq(7, 900)), Seq(5, 50)));
  EXPECT_EQ(d.Lookup(3).tokens, 36);
}

TEST(CheckpointRetention, ANegativeCapIsRejected) {
  ManagerConfig c = Hybrid(8, -1);
  const Status s = c.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_interval_checkpoints"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace hkv::testing
