// Shared prefixes kept longer (ManagerConfig::branch_bonus): when a cached block gains a second
// continuation, the prefix up to it - every token block and the checkpoint at its end - is
// marked shared, and its blocks queue behind single-use blocks freed after them. A
// conversation's own chain (each turn extends the last) is one continuation per block and keeps
// plain recency.
#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

const std::vector<int32_t> kPrompt = Seq(8, 100);  // two blocks: the system prompt

// 16 usable blocks of 4 tokens, full attention. One turnover is 16 frees.
ManagerConfig FullModel(double bonus) {
  ManagerConfig c = MakeConfig({17}, {Full(4)});
  c.branch_bonus = bonus;
  return c;
}

// Two sessions on the system prompt (the second branches from the first), then a request on
// other tokens, all ended; then an allocation that evicts 6 cached blocks. Returns the hit a
// third session on the prompt finds afterwards.
int64_t PromptHitAfterPressure(double bonus, int64_t* marked) {
  Driver d(FullModel(bonus));
  d.Add(1, Concat(kPrompt, Seq(8, 1000)));
  EXPECT_EQ(d.Prefill(1).tokens, 0);
  d.Free(1);
  d.Add(2, Concat(kPrompt, Seq(8, 2000)));
  EXPECT_EQ(d.Prefill(2).tokens, 8);
  d.Free(2);
  d.Add(3, Seq(16, 5000));
  d.Prefill(3);
  d.Free(3);
  // 10 blocks cache something (the prompt's 2, 2 of each session, 4 of request 3), 6 are fresh:
  // 12 new blocks evict 6 cached ones.
  d.Add(4, Seq(48, 7000));
  d.Run(4, 48);
  *marked = d.m().stats().shared_prefixes_marked;
  d.Add(5, Concat(kPrompt, Seq(8, 3000)));
  return d.Lookup(5).tokens;
}

TEST(SharedPrefix, ASystemPromptOutlivesSingleUseBlocksFreedAfterIt) {
  int64_t marked = 0;
  // Least recently freed first: the prompt went back with session 2, before request 3's blocks,
  // and is evicted with the sessions' tails.
  EXPECT_EQ(PromptHitAfterPressure(0, &marked), 0);
  EXPECT_EQ(marked, 0);
  // Shared: it queues behind request 3's blocks, which go instead.
  EXPECT_EQ(PromptHitAfterPressure(1, &marked), 8);
  EXPECT_EQ(marked, 1);
}

TEST(SharedPrefix, AConversationsOwnChainIsNotShared) {
  Driver d(FullModel(1));
  std::vector<int32_t> turn = Concat(kPrompt, Seq(8, 1000));
  d.Add(1, turn);
  d.Prefill(1);
  d.Free(1);
  // Each turn extends the last: one continuation per block.
  for (RequestId id = 2; id <= 3; ++id) {
    turn = Concat(turn, Seq(4, 1000 + 10 * static_cast<int32_t>(id)));
    d.Add(id, turn);
    EXPECT_EQ(d.Prefill(id).tokens, static_cast<int64_t>(turn.size()) - 4);
    d.Free(id);
  }
  EXPECT_EQ(d.m().stats().shared_prefixes_marked, 0);
  // The same block computed again after its eviction is the same continuation: 10 fresh blocks
  // and the conversation's last (freed first) make room for request 8, and request 9 computes
  // that last block again after the 20 tokens it hits.
  d.Add(8, Seq(44, 9000));
  d.Run(8, 44);
  d.Free(8);
  d.Add(9, turn);
  EXPECT_EQ(d.Prefill(9).tokens, 20);
  d.Free(9);
  EXPECT_EQ(d.m().stats().shared_prefixes_marked, 0);
  // A different continuation of the prompt is a branch.
  d.Add(10, Concat(kPrompt, Seq(8, 4000)));
  EXPECT_EQ(d.Prefill(10).tokens, 8);
  EXPECT_EQ(d.m().stats().shared_prefixes_marked, 1);
  d.Free(10);
}

// Full attention and recurrent state, one state pool of 4 pages; checkpoints admitted where
// prefixes branch and where requests end.
ManagerConfig HybridModel(double bonus) {
  ManagerConfig c = MakeConfig({65, 5}, {Full(4, 0), StateGroup(1)});
  c.prompt_checkpoints = false;
  c.branch_bonus = bonus;
  return c;
}

// Sessions 1 and 2 branch at the prompt's end (session 2 checkpoints the state there), then
// `others` requests on other tokens each end with a checkpoint of their own. The hit a third
// session finds then.
int64_t CheckpointHitAfter(double bonus, int32_t others) {
  Driver d(HybridModel(bonus));
  d.Add(1, Concat(kPrompt, Seq(8, 1000)));
  d.Prefill(1);
  d.Free(1);
  d.Add(2, Concat(kPrompt, Seq(8, 2000)));
  d.Prefill(2);
  d.Free(2);
  for (int32_t k = 0; k < others; ++k) {
    const auto id = static_cast<RequestId>(10 + k);
    d.Add(id, Seq(12, 5000 + 100 * k));
    d.Prefill(id);
    d.Free(id);
  }
  d.Add(3, Concat(kPrompt, Seq(8, 3000)));
  return d.Lookup(3).tokens;
}

TEST(SharedPrefix, TheCheckpointAtABranchIsKeptLongerToo) {
  EXPECT_EQ(CheckpointHitAfter(0, 0), 8);  // the branch's checkpoint serves the third session
  // Four single-use checkpoints later it is gone by recency, still there when shared.
  EXPECT_EQ(CheckpointHitAfter(0, 4), 0);
  EXPECT_EQ(CheckpointHitAfter(1, 4), 8);
}

TEST(SharedPrefix, TheBonusIsValidated) {
  ManagerConfig c = FullModel(-0.5);
  Result<KvCacheManager> m = KvCacheManager::Create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("branch_bonus -0.5"), std::string::npos);
  c = FullModel(65);
  EXPECT_FALSE(KvCacheManager::Create(c).ok());
  c = FullModel(1);
  c.branch_bonus_levels = 0;
  m = KvCacheManager::Create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("branch_bonus_levels 0"), std::string::npos);
}

}  // namespace
}  // namespace hkv::testing
