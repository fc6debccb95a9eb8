// The oracle mode: FutureUse ranks prefixes by the next request that needs them, and a replay
// with ReplayOptions::oracle evicts by that rank (worked by hand below).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/sim/future_use.h>
#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>

#include "replay_test_util.h"

namespace hkv {
namespace {

using testing::FullAttention;
using testing::Request;

BlockHash Digest(const std::vector<int32_t>& tokens, size_t blocks, size_t block_tokens) {
  BlockHash h = kRootHash;
  for (size_t k = 0; k < blocks; ++k)
    h = HashBlock(h, std::span<const int32_t>(tokens).subspan(k * block_tokens, block_tokens));
  return h;
}

// Prompts of 4-token blocks: A (8 tokens), B (8), and A extended by 4 (12).
const std::vector<int32_t> kA{1, 2, 3, 4, 5, 6, 7, 8}, kB{11, 12, 13, 14, 15, 16, 17, 18},
    kC{21, 22, 23, 24, 25, 26, 27, 28}, kA12{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

TEST(FutureUse, RanksByTheNextRequestNotYetAdmitted) {
  const Trace trace{Request(0, 0, kA, {}), Request(1, 0, kB, {}), Request(2, 0, kA12, {})};
  auto f = FutureUse::Create(trace, 4).value();
  const BlockHash a1 = Digest(kA12, 1, 4), a2 = Digest(kA12, 2, 4), b1 = Digest(kB, 1, 4);
  const BlockHash unknown = Digest(kC, 1, 4);
  // A hit takes at most prompt - 1 tokens: request 0 (8 tokens) needs only A's first block.
  EXPECT_EQ(f->NextUse(a1), 0);
  EXPECT_EQ(f->NextUse(a2), 2);
  EXPECT_EQ(f->NextUse(b1), 1);
  EXPECT_EQ(f->NextUse(unknown), 3);  // no request: trace.size()
  // Sooner needed ranks higher; a prefix nobody needs ranks lowest.
  EXPECT_GT(f->Rank(a1), f->Rank(b1));
  EXPECT_GT(f->Rank(b1), f->Rank(a2));
  EXPECT_GT(f->Rank(a2), f->Rank(unknown));
  EXPECT_GE(f->Rank(unknown), 1u);
  // Admitting request 0 hands back its digests; A's first block is next needed by request 2,
  // where the shorter prefix ranks above the longer one (a hit needs it first).
  const std::span<const BlockHash> changed = f->Consume(0);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0], a1);
  EXPECT_EQ(f->NextUse(a1), 2);
  EXPECT_GT(f->Rank(a1), f->Rank(a2));
  (void)f->Consume(2);
  EXPECT_EQ(f->NextUse(a1), 3);
  EXPECT_EQ(f->NextUse(a2), 3);
  EXPECT_LT(f->Rank(a2), f->Rank(b1));  // no one needs A's second block any more; B's, yes
  // Preempted, request 0 needs its prefix again.
  (void)f->Return(0);
  EXPECT_EQ(f->NextUse(a1), 0);
  EXPECT_EQ(f->NextUse(a2), 3);
  // Out-of-range indices change nothing.
  EXPECT_TRUE(f->Consume(9).empty());
  EXPECT_TRUE(f->Return(9).empty());
  EXPECT_EQ(FutureUse::Create(trace, 0).status().code(), StatusCode::kInvalidArgument);
}

// One full-attention group of 4-token blocks, 4 blocks, budget 16.
// R0 (A, t=0) and R1 (B, t=5) each leave their two prompt blocks cached. R2 (C, t=10) needs two
// blocks: every block is cached, so two are evicted. Recency evicts A's (freed first); the
// oracle knows R3 (A + 4 tokens, t=15) needs A and nobody needs B again, and evicts B's.
// R3 then hits 8 tokens under the oracle and none under recency: 8 of the 36 prompt tokens.
TEST(Oracle, KeepsThePrefixTheNextRequestNeeds) {
  const Trace trace{Request(0, 0, kA, {100}), Request(1, 5, kB, {101}), Request(2, 10, kC, {102}),
                    Request(3, 15, kA12, {103})};
  ManagerConfig c = FullAttention(4);
  ReplayOptions o;
  o.token_budget = 16;
  o.max_model_len = 64;
  o.check_invariants = true;
  o.record_requests = true;
  const ReplayReport lru = Replay(trace, c, o).value();
  EXPECT_EQ(lru.first_admission_hits, 0);
  o.oracle = true;
  const ReplayReport oracle = Replay(trace, c, o).value();
  EXPECT_EQ(oracle.first_admission_tokens, 36);
  EXPECT_EQ(oracle.first_admission_hits, 8);
  EXPECT_EQ(oracle.requests[3].first_hit_tokens, 8);
  // The oracle leaves the config it was given as it was: its rank lives in the replay.
  EXPECT_EQ(c.eviction_rank, nullptr);
}

// A hybrid under pressure with two-level memory, where ranks reach slabs (an empty slab is worth
// its best page) and preemptions return prefixes to the future: the invariant checker runs after
// every step, on several seeds. (Belady's rule is no optimum here - a hit needs a page of each
// class at one position - so the oracle may hit less than recency on some trace; it must differ.)
TEST(Oracle, AHybridInTwoLevelMemoryKeepsEveryInvariant) {
  ManagerConfig c;
  const int32_t slabs = 16, attention_pages = 16;
  c.arena.num_slabs = slabs;
  c.arena.pages_per_slab = {attention_pages, 1};
  c.pool_blocks = {slabs * attention_pages + 1, slabs + 1};
  GroupConfig attention, state;
  attention.rule.kind = TokenRuleKind::kAll;
  attention.block_tokens = 16;
  attention.pool = 0;
  state.rule.kind = TokenRuleKind::kState;
  state.pool = 1;
  c.groups = {attention, state};
  c.max_model_len = 4096;
  c.prompt_checkpoints = false;
  ReplayOptions o;
  o.token_budget = 1024;
  o.max_model_len = 4096;
  o.check_invariants = true;
  int64_t lru_hits = 0, oracle_hits = 0, preemptions = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    TraceGenOptions g;
    g.num_requests = 60;
    g.seed = seed;
    g.session_gap = 15;
    g.system_prompt_min = 100;
    g.system_prompt_max = 400;
    g.first_message_min = 20;
    g.first_message_max = 800;
    g.followup_min = 10;
    g.followup_max = 300;
    g.output_min = 200;
    g.output_max = 1500;
    g.max_prompt_tokens = 2000;
    const Trace trace = GenerateTrace(g).value();
    o.oracle = false;
    const ReplayReport lru = Replay(trace, c, o).value();
    o.oracle = true;
    const Result<ReplayReport> oracle = Replay(trace, c, o);
    ASSERT_TRUE(oracle.ok()) << "seed " << seed << ": " << oracle.status().ToString();
    lru_hits += lru.first_admission_hits;
    oracle_hits += oracle->first_admission_hits;
    preemptions += oracle->preemptions;
  }
  EXPECT_GT(preemptions, 0);         // the returned-prefix path ran
  EXPECT_NE(oracle_hits, lru_hits);  // the rank took effect
}

TEST(Oracle, RefusesAConfigWithARankOfItsOwn) {
  const Trace trace{Request(0, 0, kA, {100})};
  ManagerConfig c = FullAttention(4);
  c.eviction_rank = FutureUse::Create(trace, 4).value();
  ReplayOptions o;
  o.max_model_len = 64;
  o.oracle = true;
  const Status own = Replay(trace, c, o).status();
  EXPECT_EQ(own.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(own.message().find("already has an eviction rank"), std::string::npos) << own.message();
  // Without the oracle, the config's own rank is used: a manager with a rank replays fine.
  o.oracle = false;
  EXPECT_TRUE(Replay(trace, c, o).ok());
}

}  // namespace
}  // namespace hkv
