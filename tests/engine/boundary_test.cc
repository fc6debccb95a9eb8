// Targeted boundary cases, per model (and so per layer kind), each run by hand through the manager
// and the paged cache and compared with the dense reference: prefix hits one token before, at
// and after a block / window / chunk / checkpoint boundary; prompts shorter than a block;
// preemption in the middle of a chunked prefill (with a step left open); truncation to a
// position with and without a recurrent checkpoint.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "paged_harness.h"

namespace hkv {
namespace {

using testing::Continue;
using testing::ExpectMatchesDense;
using testing::Generate;
using testing::Generation;
using testing::Harness;
using testing::Make;
using testing::Prompt;

constexpr int64_t kCheckpointInterval = 8;  // two blocks of 4 tokens

bool Has(const ModelSpec& spec, bool (*pred)(const LayerSpec&)) {
  return std::any_of(spec.layers.begin(), spec.layers.end(), pred);
}
bool IsWindow(const LayerSpec& l) {
  return l.kind == LayerKind::kSlidingWindow;
}
bool IsChunk(const LayerSpec& l) {
  return l.kind == LayerKind::kChunkedLocal;
}
bool IsState(const LayerSpec& l) {
  return IsRecurrentKind(l.kind);
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Boundaries : public ::testing::TestWithParam<std::string> {};

// Request B shares its first P tokens with running request A, for P one before, at and one after
// each boundary the model has. The hit is the longest usable prefix: a multiple of the block
// size, and on recurrent models a checkpoint (multiples of the interval); B then matches dense.
TEST_P(Boundaries, HitOneBeforeAtAndAfterEachBoundary) {
  const ModelSpec spec = testing::LoadScaled(GetParam());
  const TinyModelOptions o;
  std::vector<int64_t> boundaries{4};  // the block
  if (Has(spec, IsWindow)) boundaries.push_back(o.window);
  if (Has(spec, IsChunk)) boundaries.push_back(o.chunk);
  const bool state = Has(spec, IsState);
  if (state) boundaries.push_back(kCheckpointInterval);
  uint32_t seed = 10;
  for (int64_t b : boundaries) {
    for (int64_t p : {b - 1, b, b + 1}) {
      SCOPED_TRACE("boundary " + std::to_string(b) + ", shared prefix " + std::to_string(p));
      Harness s = Make(GetParam(), o, kCheckpointInterval);
      const auto a = Prompt(static_cast<int32_t>(p) + 6, ++seed);
      const Generation ga = Generate(s, 1, a, 5, 2);
      ExpectMatchesDense(s, ga, a.size());
      const auto shared = std::vector<int32_t>(a.begin(), a.begin() + p);
      const auto bp = Concat(shared, Prompt(7, ++seed + 1000));
      const Generation gb = Generate(s, 2, bp, 5, 3);
      const int64_t unit = state ? kCheckpointInterval : 4;
      EXPECT_EQ(gb.hit, p / unit * unit);
      ExpectMatchesDense(s, gb, bp.size());
      EXPECT_TRUE(s.manager->CheckInvariants().ok());
    }
  }
}

// A prompt shorter than one block: nothing is published (its block is partial), so an equal
// prompt hits nothing; both match dense.
TEST_P(Boundaries, PromptShorterThanOneBlock) {
  Harness s = Make(GetParam(), {}, kCheckpointInterval);
  const auto a = Prompt(3, 77);
  const Generation ga = Generate(s, 1, a, 4, 6);
  ExpectMatchesDense(s, ga, a.size());
  const Generation gb = Generate(s, 2, a, 4, 2);
  EXPECT_EQ(gb.hit, 0);
  ExpectMatchesDense(s, gb, a.size());
  ASSERT_TRUE(s.manager->Free(1).ok());
  ASSERT_TRUE(s.manager->Free(2).ok());
  EXPECT_TRUE(s.manager->CheckInvariants().ok());
}

// Preempted two chunks into a prefill, with its third chunk's step open (computed, never
// committed): freed, re-added and looked up, it resumes at the last committed chunk boundary,
// the abandoned chunk's blocks are not trusted (they are poisoned), and the result matches dense.
TEST_P(Boundaries, PreemptedInTheMiddleOfAChunkedPrefill) {
  Harness s = Make(GetParam(), {}, kCheckpointInterval);
  const auto prompt = Prompt(30, 91);
  Generation g;
  g.tokens = prompt;
  ASSERT_TRUE(testing::AddRequest(s, 1, prompt).ok());
  ASSERT_TRUE(s.manager->Lookup(1).ok());
  for (int chunk = 0; chunk < 3; ++chunk) {
    ASSERT_TRUE(s.manager->Allocate(1, 8).ok());
    testing::RunOpenStep(s, 1, g.tokens, g);
    if (chunk < 2) {
      ASSERT_TRUE(s.manager->Commit(1, (chunk + 1) * 8).ok());
    }
  }
  ASSERT_TRUE(s.manager->Free(1).ok());  // the open step is abandoned
  EXPECT_TRUE(s.cache->PoisonFreeBlocks(*s.manager).ok());
  EXPECT_TRUE(s.manager->CheckInvariants().ok());
  Generation again;
  again.tokens = prompt;
  ASSERT_TRUE(testing::AddRequest(s, 2, prompt).ok());
  const PrefixHit hit = s.manager->Lookup(2).value();
  EXPECT_EQ(hit.tokens, 16);
  Continue(s, 2, again, prompt.size(), 8, 4, hit);
  ExpectMatchesDense(s, again, prompt.size());
  EXPECT_EQ(again.logits.begin()->first, 16);
}

// Truncation to a checkpoint position (24) restores the state exactly; to a position between
// checkpoints (27) it rolls back to the checkpoint before and asks for the difference to be
// recomputed. Attention-only models keep exactly what was asked (windows take released blocks
// back from the cache). Either way, a different continuation then matches dense.
TEST_P(Boundaries, TruncateWithAndWithoutACheckpoint) {
  const bool state = Has(testing::LoadScaled(GetParam()), IsState);
  for (int64_t n : {int64_t{24}, int64_t{27}}) {
    SCOPED_TRACE("truncate to " + std::to_string(n));
    Harness s = Make(GetParam(), {}, kCheckpointInterval);
    const auto prompt = Prompt(20, 5);
    Generation g = Generate(s, 1, prompt, 6, 12);  // decodes one token per step past 24 and 27
    ASSERT_GE(s.manager->NumComputed(1).value(), 31);
    const TruncateResult t = s.manager->Truncate(1, n).value();
    EXPECT_TRUE(s.cache->PoisonFreeBlocks(*s.manager).ok());
    EXPECT_EQ(t.tokens, n);
    const int64_t expect_computed = state ? n / kCheckpointInterval * kCheckpointInterval : n;
    EXPECT_EQ(t.computed, expect_computed);
    EXPECT_EQ(t.recompute, n - expect_computed);
    Generation h;
    h.tokens.assign(g.tokens.begin(), g.tokens.begin() + n);
    const auto more = Prompt(3, 606);
    ASSERT_TRUE(s.manager->AppendTokens(1, more).ok());
    h.tokens = Concat(h.tokens, more);
    Continue(s, 1, h, h.tokens.size(), 5, 4);
    EXPECT_EQ(h.logits.begin()->first, t.computed);
    ExpectMatchesDense(s, h, h.tokens.size());
    EXPECT_TRUE(s.manager->CheckInvariants().ok());
  }
}

// Three requests share a 12-token prefix (a "system prompt") and then diverge, each freed before
// the next starts, with no interval checkpoints. The first leaves attention blocks for the
// prefix, but a window (12) or chunk (16) released its blocks there mid-request and the state
// exists only at its own prompt's end: the second hits the prefix on models without recurrent
// layers (through window/chunk blocks Free took back into the cache) and nothing on recurrent
// ones, where it checkpoints the state at 12, the point it leaves the cached prefix; the third
// then hits 12 everywhere. All three match dense with freed blocks poisoned.
TEST_P(Boundaries, SharedPrefixAfterItsRequestsEnded) {
  Harness s = Make(GetParam());
  ManagerConfig config = ManagerConfig::FromPlan(s.plan).value();
  config.checkpoint_interval = 0;  // checkpoints only where the manager chooses them
  s.manager.emplace(KvCacheManager::Create(config).value());
  const bool state = Has(s.spec, IsState);
  const auto shared = Prompt(12, 71);
  for (RequestId id : {1, 2, 3}) {
    SCOPED_TRACE("request " + std::to_string(id));
    const auto prompt = Concat(shared, Prompt(9, 500 + static_cast<uint32_t>(id)));
    const Generation g = Generate(s, id, prompt, 8, 3);
    const int64_t expected = id == 1 ? 0 : id == 2 && state ? 0 : 12;
    EXPECT_EQ(g.hit, expected);
    ExpectMatchesDense(s, g, prompt.size());
    ASSERT_TRUE(s.manager->Free(id).ok());
    ASSERT_TRUE(s.cache->PoisonFreeBlocks(*s.manager).ok());
    ASSERT_TRUE(s.manager->CheckInvariants().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Boundaries, testing::kEngineModels, testing::ModelTestName);

// An engine that reads K/V the manager did not give it: request B receives the block request A
// freed without a prefix identity, and a bypassing engine starts B's pass two positions late,
// trusting A's leftovers for them. The leftovers are right (same tokens), so without poisoning the
// bypass is invisible; with poisoning its logits are NaN.
std::vector<float> BypassingPass(bool poison, Harness& s, std::vector<int32_t>& tokens) {
  const auto a = Prompt(10, 5);
  Generate(s, 1, a, 16, 1);  // positions 0..9 computed; block 2 holds 8 and 9, unpublished
  const std::vector<int32_t> a_table(s.manager->BlockTable(1, 0).value().begin(),
                                     s.manager->BlockTable(1, 0).value().end());
  EXPECT_TRUE(s.manager->Free(1).ok());
  if (poison) {
    EXPECT_TRUE(s.cache->PoisonFreeBlocks(*s.manager).ok());
  }
  tokens = Concat(a, Prompt(4, 6));
  EXPECT_TRUE(testing::AddRequest(s, 2, tokens).ok());
  const PrefixHit hit = s.manager->Lookup(2).value();
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_TRUE(s.manager->Allocate(2, 6, hit).ok());
  EXPECT_EQ(s.manager->BlockTable(2, 0).value()[2], a_table[2]);  // A's block, reused first
  auto view = s.cache->View(*s.manager, 2);
  EXPECT_TRUE(view.ok());
  // The manager's step is [8, 14); the bypass computes [10, 14) only.
  return Forward(s.spec, s.weights, tokens, 10, 14, **view);
}

TEST(Poisoning, ExposesAnEngineThatReadsBlocksTheManagerDidNotGiveIt) {
  const auto vocab = static_cast<size_t>(TinyModelOptions{}.vocab);
  for (bool poison : {false, true}) {
    Harness s = Make("meta-llama--Llama-3.1-8B");
    std::vector<int32_t> tokens;
    const std::vector<float> logits = BypassingPass(poison, s, tokens);
    const std::vector<float> dense = DenseLogits(s.spec, s.weights, tokens);
    int64_t nan = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < logits.size(); ++i) {
      nan += std::isnan(logits[i]) ? 1 : 0;
      worst = std::max(worst, std::fabs(logits[i] - dense[10 * vocab + i]));
    }
    if (poison) {
      EXPECT_EQ(nan, static_cast<int64_t>(logits.size()));
    } else {
      EXPECT_EQ(nan, 0);
      EXPECT_LE(worst, 1e-4f);  // why poisoning is needed: stale data looks right
    }
  }
}

}  // namespace
}  // namespace hkv
