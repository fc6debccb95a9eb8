// Checkpoint coverage (ManagerConfig::evict_uncovered): on a model whose hits need a recurrent
// checkpoint at the hit position, attention blocks no cached checkpoint covers and checkpoints
// whose attention prefix was evicted are demoted, and so is the checkpoint a request's hit started
// from once the request ends with a newer state on the same, unbranched path.
#include <algorithm>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

constexpr int32_t kAttentionPool = 0;
constexpr int32_t kStatePool = 1;

// 4-token blocks. No checkpoint inside a chunk unless `splits`: a prefilled request then holds
// one state block, published when it ends.
ManagerConfig Hybrid(int32_t attention_blocks, int32_t state_blocks, bool on, int32_t splits = 0) {
  ManagerConfig c = MakeConfig({attention_blocks + 1, state_blocks + 1},
                               {Full(4, kAttentionPool), StateGroup(kStatePool)});
  c.max_state_splits = splits;
  c.evict_uncovered = on;
  return c;
}

// Runs a request's whole prompt and ends it.
void Serve(Driver& d, RequestId id, const std::vector<int32_t>& prompt) {
  d.Add(id, prompt);
  d.Prefill(id);
  d.Free(id);
}

// The state block each checkpoint position was last published into, from the events since the
// last call.
// The tokens a new request with `prompt` would reuse; the request is added and freed again.
int64_t HitOf(Driver& d, RequestId id, const std::vector<int32_t>& prompt) {
  d.Add(id, prompt);
  const int64_t tokens = d.Lookup(id).tokens;
  d.Free(id);
  return tokens;
}

std::map<int64_t, int32_t> Checkpoints(Driver& d) {
  std::map<int64_t, int32_t> out;
  for (const ManagerEvent& e : d.m().TakeEvents()) {
    if (e.pool == kStatePool && e.kind == KvEvent::Kind::kStored) out[e.position] = e.block;
  }
  return out;
}

int64_t Position(const std::vector<int32_t>& order, int32_t block) {
  return std::find(order.begin(), order.end(), block) - order.begin();
}

class CheckpointCoverage : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointCoverage, AnEvictedCheckpointDemotesTheAttentionOnlyItCovered) {
  const bool on = GetParam();
  Driver d(Hybrid(64, 2, on));
  Serve(d, 0, Seq(8, 500));  // two attention blocks and the state at 8
  Serve(d, 1, Seq(4, 500));  // the first of them again, and the state at 4
  EXPECT_EQ(d.m().Usage(kStatePool).num_cached, 2);
  EXPECT_EQ(d.m().stats().uncovered_blocks_demoted, 0);
  // Request 2's state takes the oldest checkpoint's block: request 0's state at 8. Its second
  // attention block is now of no use to anyone; its first is still what the state at 4 needs.
  d.Add(2, Seq(8, 100));
  d.Prefill(2);
  EXPECT_EQ(d.m().stats().uncovered_blocks_demoted, on ? 1 : 0);
  EXPECT_EQ(d.m().stats().unreachable_checkpoints_demoted, 0);
  // Demoted, not dropped: the block keeps its identity until reused.
  EXPECT_EQ(d.m().Usage(kAttentionPool).num_cached, 4);
  d.Free(2);
  EXPECT_EQ(HitOf(d, 3, Concat(Seq(4, 500), Seq(4, 1))), 4);
}

TEST_P(CheckpointCoverage, AnEvictedAttentionBlockDemotesTheCheckpointAfterIt) {
  const bool on = GetParam();
  Driver d(Hybrid(4, 8, on));
  Serve(d, 0, Seq(4, 900));  // one attention block and the state at 4
  Serve(d, 1, Seq(8, 500));  // two blocks and the state at 8
  EXPECT_EQ(d.m().Usage(kStatePool).num_cached, 2);
  // One of the four attention blocks is free and uncached; an 8-token request needs two, so the
  // oldest cached block goes - request 0's, and its checkpoint can never be hit again.
  d.Add(2, Seq(8, 100));
  d.Prefill(2);
  EXPECT_EQ(d.m().stats().unreachable_checkpoints_demoted, on ? 1 : 0);
  EXPECT_EQ(d.m().stats().uncovered_blocks_demoted, 0);
  EXPECT_EQ(d.m().Usage(kStatePool).num_cached, 2);  // demoted, still cached
  d.Free(2);
  // Request 1's prefix is whole, and still hits.
  EXPECT_EQ(HitOf(d, 3, Concat(Seq(8, 500), Seq(4, 1))), 8);
}

TEST_P(CheckpointCoverage, AFollowUpDemotesThePreviousTurnsEndButNotABranchPoint) {
  const bool on = GetParam();
  Driver d(Hybrid(64, 16, on, /*splits=*/1));
  Serve(d, 0, Seq(8, 500));
  const int32_t other = Checkpoints(d).at(8);
  Serve(d, 1, Seq(8, 100));
  const int32_t turn_end = Checkpoints(d).at(8);
  // Request 2 continues request 1's conversation: it starts from the state at 8 and ends with
  // one at 12 on the same path, so the one at 8 could serve only a request leaving the path at 8.
  d.Add(2, Concat(Seq(8, 100), Seq(4, 700)));
  EXPECT_EQ(d.Prefill(2).tokens, 8);
  d.Free(2);
  EXPECT_EQ(d.m().stats().superseded_hits_demoted, on ? 1 : 0);
  // Demoted: evicted before request 0's older checkpoint. Otherwise the hit made it the younger.
  const std::vector<int32_t> order = ManagerProbe::FreeListOrder(d.m(), kStatePool);
  if (on) {
    EXPECT_LT(Position(order, turn_end), Position(order, other));
  } else {
    EXPECT_LT(Position(order, other), Position(order, turn_end));
  }
  // A branch point keeps its place: requests share a 4-token system prompt; the second diverges
  // from the first there and publishes the state at 4, the third and fourth start from it.
  Serve(d, 3, Concat(Seq(4, 900), Seq(4, 1)));
  Serve(d, 4, Concat(Seq(4, 900), Seq(4, 2)));
  const int64_t demoted = d.m().stats().superseded_hits_demoted;
  for (RequestId id : {RequestId{5}, RequestId{6}}) {
    d.Add(id, Concat(Seq(4, 900), Seq(4, static_cast<int32_t>(id))));
    EXPECT_EQ(d.Prefill(id).tokens, 4);
    d.Free(id);
  }
  EXPECT_EQ(d.m().stats().superseded_hits_demoted, demoted);
}

INSTANTIATE_TEST_SUITE_P(OnAndOff, CheckpointCoverage, ::testing::Bool());

}  // namespace
}  // namespace hkv::testing
