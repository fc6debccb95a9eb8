// The thrash guard (ManagerConfig::thrash_guard): what it learns from chain ends coming back, the
// share it picks from that, and, through the manager, a round of conversations too large for the
// cache where recency keeps none until its next turn and the guard keeps some.
#include "../../src/manager/thrash_guard.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

using manager_internal::ThrashGuard;

BlockHash H(uint64_t i) {
  return {i * 0x9E3779B97F4A7C15ull + 1, i};
}

// `n` chains freed one per `spacing` ticks, each coming back `age` ticks after it was freed (only
// every `every`-th one when given; the others never).
void Train(ThrashGuard& g, int n, uint64_t spacing, uint64_t age, uint64_t residence,
           int every = 1) {
  uint64_t now = 1;
  std::vector<std::pair<uint64_t, int>> due;  // (tick, chain)
  for (int i = 0; i < n; ++i, now += spacing) {
    while (!due.empty() && due.front().first <= now) {
      const BlockHash end = H(static_cast<uint64_t>(due.front().second));
      g.Started({&end, 1}, 0, now);
      due.erase(due.begin());
    }
    g.Freed(H(static_cast<uint64_t>(i)), now, residence);
    g.Tick(residence);
    if (i % every == 0) due.emplace_back(now + age, i);
  }
}

TEST(ThrashGuard, KeepsRecencyWhenConversationsComeBackWithinTheCache) {
  ThrashGuard g;
  Train(g, 400, 10, 300, 1000);
  EXPECT_EQ(g.keep_share(), 1.0);
  EXPECT_NEAR(g.ReturnedWithin(1000), 1.0, 1e-9);
  EXPECT_NEAR(g.Expected(1.0, 1000), 1.0, 1e-9);
  EXPECT_GT(g.returns_seen(), 350);
  EXPECT_TRUE(g.CheckInvariants());
}

TEST(ThrashGuard, KeepsAShareWhenConversationsOutlastTheCache) {
  ThrashGuard g;
  // Every chain comes back 4000 ticks later; recency holds one for 1000: it keeps none.
  Train(g, 1200, 10, 4000, 1000);
  EXPECT_NEAR(g.ReturnedWithin(1000), 0.0, 1e-9);
  EXPECT_NEAR(g.Expected(1.0, 1000), 0.0, 1e-9);
  EXPECT_LT(g.keep_share(), 1.0);
  // The kept ones need about four times recency's residence: a quarter of the chains or fewer.
  EXPECT_LE(g.keep_share(), 0.25);
  EXPECT_GT(g.Expected(g.keep_share(), 1000), 0.1);
  EXPECT_TRUE(g.CheckInvariants());
}

// Under overload the measured returns are too few for a share below 1 to win a meaningful part of
// the requests, whatever their ratio: recency stays.
TEST(ThrashGuard, AGainTooSmallToMatterKeepsRecency) {
  ThrashGuard g;
  Train(g, 3000, 10, 4000, 1000, 50);  // one chain in 50 returns, four residences later
  EXPECT_NEAR(g.Expected(1.0, 1000), 0.0, 1e-9);
  EXPECT_GT(g.Expected(0.25, 1000), 0.0);
  EXPECT_LT(g.Expected(0.25, 1000), 0.05);
  EXPECT_EQ(g.keep_share(), 1.0);
}

// What the cache frees besides finished requests' own blocks (window blocks left behind, states
// superseded, preempted requests) drains the kept queue too: probation stretches a kept chain's
// life less.
TEST(ThrashGuard, ChurnShortensWhatProbationBuys) {
  ThrashGuard g;
  EXPECT_NEAR(g.Lifetime(1000, 0.25), 4000, 1e-6);  // nothing measured: no churn
  g.Freeing(0);
  g.Released(100, true);   // a finished request's 100 ticks
  g.Freeing(400);          // 300 ticks of churn since
  g.Released(500, false);  // a preempted request's 100: churn too
  g.Freeing(500);
  g.Released(600, true);  // 200 of 600 ticks are finished requests' own
  EXPECT_NEAR(g.Lifetime(1000, 1), 1000, 1e-6);
  EXPECT_NEAR(g.Lifetime(1000, 0.25), 1000 / (4.0 / 6 + 2.0 / 6 * 0.25), 1e-6);
}

TEST(ThrashGuard, FindsTheLatestEndAPromptContinues) {
  ThrashGuard g;
  std::vector<BlockHash> prompt;
  for (uint64_t i = 0; i < 8; ++i)
    prompt.push_back(H(100 + i));
  g.Freed(prompt[3], 10, 1000);  // an earlier turn
  g.Freed(prompt[6], 20, 1000);  // the turn this prompt continues
  // The hit reached block 6: the chain it continues was kept.
  EXPECT_TRUE(g.Started(prompt, 7, 50));
  EXPECT_EQ(g.returns_seen(), 1);
  EXPECT_NEAR(g.ReturnedWithin(40), 1.0, 1e-9);  // came back after 30 ticks
  EXPECT_NEAR(g.ReturnedWithin(20), 0.0, 1e-9);
  // That end is spent; the earlier one is found next, and a hit short of it did not continue it.
  EXPECT_FALSE(g.Started(prompt, 3, 60));
  EXPECT_EQ(g.returns_seen(), 2);
  EXPECT_FALSE(g.Started(prompt, 8, 70));  // nothing left to find
  EXPECT_EQ(g.returns_seen(), 2);
  EXPECT_TRUE(g.CheckInvariants());
}

// The look-back is in tokens: a follow-up message of 1500 tokens is 94 blocks of 16 tokens but
// 1500 blocks of one token, and the end it continues must be found at either block size.
TEST(ThrashGuard, LooksBackTheSameTokensWhateverTheBlockSize) {
  for (const int32_t hash_tokens : {1, 4, 16}) {
    SCOPED_TRACE(hash_tokens);
    const int64_t message = 1500 / hash_tokens;  // hash blocks of the new message
    const int64_t limit = ThrashGuard::kLookBackTokens / hash_tokens;
    std::vector<BlockHash> prompt;
    for (uint64_t i = 0; i < static_cast<uint64_t>(message + limit + 10); ++i)
      prompt.push_back(H(1000 + i));
    const size_t n = prompt.size();
    ThrashGuard g(0, hash_tokens);
    g.Freed(prompt[n - 1 - static_cast<size_t>(message)], 10, 1000);
    EXPECT_FALSE(g.Started(prompt, 0, 20));
    EXPECT_EQ(g.returns_seen(), 1);
    // One block past the look-back is not searched.
    ThrashGuard far(0, hash_tokens);
    far.Freed(prompt[n - 1 - static_cast<size_t>(limit)], 10, 1000);
    EXPECT_FALSE(far.Started(prompt, 0, 20));
    EXPECT_EQ(far.returns_seen(), 0);
    EXPECT_TRUE(g.CheckInvariants());
    EXPECT_TRUE(far.CheckInvariants());
  }
}

TEST(ThrashGuard, EndsPastTheHorizonCountAsNever) {
  ThrashGuard g;
  const BlockHash a = H(1), b = H(2);
  g.Freed(a, 0, 10);
  g.Freed(b, 1000, 10);  // 1000 > 16 residences of 10: a is forgotten
  EXPECT_EQ(g.ends_forgotten(), 1);
  EXPECT_FALSE(g.Started({&a, 1}, 1, 1001));
  EXPECT_EQ(g.returns_seen(), 0);
  EXPECT_NEAR(g.ReturnedWithin(1e12), 0.0, 1e-9);  // never is beyond every age
  EXPECT_TRUE(g.CheckInvariants());
}

TEST(ThrashGuard, AFixedShareStaysAndKeepsThatShare) {
  ThrashGuard g(0.25);
  Train(g, 300, 10, 100, 1000);  // recency would serve: a learned share would be 1
  EXPECT_EQ(g.keep_share(), 0.25);
  int kept = 0;
  for (int i = 0; i < 4000; ++i)
    kept += g.Keep(false) ? 1 : 0;
  EXPECT_NEAR(kept / 4000.0, 0.25, 0.03);
  EXPECT_TRUE(g.Keep(true));
}

// Sixteen conversation slots served round robin, each conversation four turns of two blocks more
// than the last (six on average); 48 blocks hold about half of them. Recency evicts each chain
// before its next turn; the guard learns that, keeps a share of the chains, and those hit on their
// next turns.
struct RoundRobin {
  int64_t follow_up_hits = 0;
  ManagerStats stats;
};

RoundRobin ServeRoundRobin(bool guard) {
  ManagerConfig c = MakeConfig({49}, {Full(4)});
  c.thrash_guard = guard;
  Driver d(c);
  RoundRobin out;
  constexpr int kSlots = 16, kTurns = 4, kRounds = 40;
  std::vector<std::vector<int32_t>> history(kSlots);
  RequestId id = 1;
  for (int round = 0; round < kRounds; ++round) {
    for (int s = 0; s < kSlots; ++s, ++id) {
      const int turn = round % kTurns;
      const auto base = static_cast<int32_t>(100000 * (s + 1) + 1000 * round);
      std::vector<int32_t>& h = history[static_cast<size_t>(s)];
      if (turn == 0) h.clear();
      h = Concat(h, Seq(turn == 0 ? 8 : 4, base));  // the user's message
      d.Add(id, h);
      const PrefixHit hit = d.Prefill(id);
      if (turn > 0) out.follow_up_hits += hit.tokens;
      for (int32_t t = 0; t < 4; ++t) {  // the reply
        d.Decode(id, base + 500 + t);
        h.push_back(base + 500 + t);
      }
      d.Free(id);
    }
  }
  out.stats = d.m().stats();
  return out;
}

TEST(ThrashGuard, KeepsConversationsWhereRecencyKeepsNone) {
  const RoundRobin lru = ServeRoundRobin(false);
  const RoundRobin kept = ServeRoundRobin(true);
  EXPECT_EQ(lru.stats.thrash_keep_share, 1.0);
  EXPECT_EQ(lru.stats.thrash_probation_frees, 0);
  EXPECT_LT(kept.stats.thrash_keep_share, 1.0);
  EXPECT_GT(kept.stats.thrash_probation_frees, 0);
  EXPECT_GT(kept.stats.thrash_returns_seen, 300);
  // Measured: 160 tokens with recency alone, 1412 with the guard.
  EXPECT_GT(kept.follow_up_hits, 4 * lru.follow_up_hits)
      << "recency " << lru.follow_up_hits << ", guard " << kept.follow_up_hits;
}

// 16 blocks of 4 tokens. An older request's two blocks are cached (kept: it was preempted), then
// request 2's; a third request then needs 14 fresh blocks, evicting two cached ones. Finished
// with a keep share of 1/16, request 2 went on probation and loses its blocks first; preempted,
// it keeps its place behind the older ones, which go instead, and its prefix still hits.
TEST(ThrashGuard, APreemptedRequestKeepsItsPlace) {
  for (const FreeReason reason : {FreeReason::kPreempted, FreeReason::kFinished}) {
    ManagerConfig c = MakeConfig({17}, {Full(4)});
    c.thrash_guard = true;
    c.thrash_keep_share = 1.0 / 16;
    Driver d(c);
    d.Add(1, Seq(8, 1000));
    d.Prefill(1);
    ASSERT_TRUE(d.m().Free(1, FreeReason::kPreempted).ok());
    d.Add(2, Seq(8, 2000));
    d.Prefill(2);
    ASSERT_TRUE(d.m().Free(2, reason).ok());
    d.Check();
    d.Add(3, Seq(56, 3000));
    d.Prefill(3);

    d.Free(3);
    d.Add(4, Seq(8, 2000));
    d.Add(5, Seq(8, 1000));
    // A hit stops a token short of the prompt: 4 of the 8 tokens.
    const bool preempted = reason == FreeReason::kPreempted;
    EXPECT_EQ(d.Lookup(4).tokens, preempted ? 4 : 0);
    EXPECT_EQ(d.Lookup(5).tokens, preempted ? 0 : 4);
    EXPECT_EQ(d.m().stats().thrash_probation_frees, preempted ? 1 : 2);  // request 3 too
  }
}

TEST(ThrashGuard, AResumedRequestGetsItsFirstAnswerBackAndCountsNoReturn) {
  ThrashGuard g;
  const BlockHash end = H(7);
  g.Freed(end, 10, 1000, /*preempted=*/true, /*continued=*/true);
  EXPECT_TRUE(g.Started({&end, 1}, 0, 20));
  EXPECT_EQ(g.returns_seen(), 0);
  g.Freed(end, 30, 1000, true, false);
  EXPECT_FALSE(g.Started({&end, 1}, 1, 40));
  // Preempted ends forgotten unclaimed are no "never" either.
  g.Freed(H(8), 50, 1, true, false);
  g.Freed(H(9), 100000, 1, false, false);
  EXPECT_EQ(g.ends_forgotten(), 0);
  EXPECT_NEAR(g.ReturnedWithin(1e12), 0.0, 1e-9);  // no outcome at all
  EXPECT_TRUE(g.CheckInvariants());
}

TEST(ThrashGuard, ABadKeepShareIsRefused) {
  for (double share : {-0.5, 1.5}) {
    ManagerConfig c = MakeConfig({17}, {Full(4)});
    c.thrash_guard = true;
    c.thrash_keep_share = share;
    const auto m = KvCacheManager::Create(c);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("thrash_keep_share"), std::string::npos);
  }
}

}  // namespace
}  // namespace hkv::testing
