// The end-to-end proof over scaled real models: randomised workloads with prefix sharing,
// multi-turn continuations, forks, speculative decoding and memory pressure give exactly the
// dense reference's tokens and logits, and every feature really ran.
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/engine/verify.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "../pool/scrambled_rank.h"
#include "engine_test_util.h"

namespace hkv {
namespace {

class Verify : public ::testing::TestWithParam<std::string> {};

// x 12 models > 10,000 in the normal build; under the sanitizers the seeds stop earlier, once
// every feature below has run.
constexpr int64_t kStepsPerModel = testing::kSanitized ? 200 : 860;

TEST_P(Verify, RandomWorkloadsMatchDenseAndExerciseEveryFeature) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + GetParam(), load);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  bool windows = false, state = false, cross = false;
  const auto scaled = ScaleModel(*real, {});
  ASSERT_TRUE(scaled.ok()) << scaled.status().ToString();
  for (const LayerSpec& l : scaled->layers) {
    windows = windows || l.kind == LayerKind::kSlidingWindow || l.kind == LayerKind::kChunkedLocal;
    state = state || IsRecurrentKind(l.kind);
    cross = cross || l.kind == LayerKind::kCrossAttention;
  }
  // Seeds until this model has run kStepsPerModel scheduler steps: over the bundled models, more
  // than 10,000 randomised engine steps per test run, every one checked against dense.
  int64_t steps = 0;
  int64_t reclaimed = 0;
  int64_t shortest_hit = 0;  // recurrent models: fewest tokens a hit reused, over the seeds
  int32_t padded_block = 0;
  int64_t default_memory = 0;  // the budget RunVerify picks for this model
  bool one_pool = false;       // the plan has no slabs: the manager remembers branch points
  EngineCounters all;
  // Every feature the model can use has run (single seeds may miss one: a light workload needs
  // no preemption, a run of unlucky drafts accepts none).
  const auto every_feature_ran = [&] {
    bool ran = all.prefix_hit_tokens > 0 && all.preemptions > 0 && all.forks > 0 &&
               all.truncations > 0 && all.drafts_accepted > 0;
    if (windows) ran = ran && all.window_blocks_freed > 0 && all.branch_blocks_given_back > 0;
    if (windows && one_pool) ran = ran && all.remembered_branches_kept > 0;
    if (state) {
      ran = ran && all.checkpoint_hits > 0 && shortest_hit > 0 &&
            all.rolling_states_given_back > 0 && all.coverage_demotions > 0;
    }
    if (cross) ran = ran && all.cross_attention_reuses > 0;
    if (state && !windows) {
      ran = ran && reclaimed > 0 && all.compactions > 0 && all.pages_moved > 0 &&
            all.compactions_for_states > 0;
    }
    return ran;
  };
  for (uint64_t seed = 1;
       seed <= 2 || steps < kStepsPerModel || (!every_feature_ran() && seed <= 80); ++seed) {
    VerifyOptions o;
    o.seed = seed;
    // Odd seeds leave stranded pages in place, as an engine that never compacts would.
    o.compact = seed % 2 == 0;
    // A model whose default budget is used well (Jamba: compaction rescues it; recurrent models
    // giving back rolling states) may not preempt or compact in dozens of seeds; once the steps
    // are in, the search for a preemption or compaction runs on two thirds of that budget.
    const bool compaction_missing = state && !windows && all.compactions == 0;
    if (steps >= kStepsPerModel && (all.preemptions == 0 || compaction_missing)) {
      o.memory_bytes = default_memory * 2 / 3;
    }
    // Attention no longer takes a state slab only to spare its cache, so on a reduced Jamba the
    // states keep their slabs and compaction is wanted only under harder pressure.
    if (steps >= kStepsPerModel && compaction_missing && seed % 4 == 0) {
      o.memory_bytes = default_memory / 2;
    }
    auto r = RunVerify(*real, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const EngineCounters& f = r->features;
    const std::string what = "seed " + std::to_string(seed) + ": steps " +
                             std::to_string(r->steps) + ", requests " + std::to_string(r->requests);
    steps += r->steps;
    if (o.memory_bytes == 0) default_memory = r->memory_bytes;
    reclaimed += r->slabs_reclaimed;
    one_pool = !r->two_level;
    padded_block = r->padded_block_tokens;
    if (f.shortest_checkpoint_hit > 0 &&
        (shortest_hit == 0 || f.shortest_checkpoint_hit < shortest_hit)) {
      shortest_hit = f.shortest_checkpoint_hit;
    }
    EXPECT_TRUE(r->completed) << what;
    EXPECT_EQ(r->mismatches, 0) << what;
    EXPECT_LE(r->max_logit_diff, 1e-4f) << what;
    EXPECT_GE(r->requests, o.requests) << what;
    all.prefix_hit_tokens += f.prefix_hit_tokens;
    all.preemptions += f.preemptions;
    all.forks += f.forks;
    all.truncations += f.truncations;
    all.drafts_accepted += f.drafts_accepted;
    all.window_blocks_freed += f.window_blocks_freed;
    all.branch_blocks_given_back += f.branch_blocks_given_back;
    all.remembered_branches_kept += f.remembered_branches_kept;
    all.rolling_states_given_back += f.rolling_states_given_back;
    all.coverage_demotions += f.coverage_demotions;
    all.checkpoint_hits += f.checkpoint_hits;
    all.cross_attention_reuses += f.cross_attention_reuses;
    all.compactions += f.compactions;
    all.pages_moved += f.pages_moved;
    all.compactions_for_states += f.compactions_for_states;
  }
  const std::string what =
      "steps " + std::to_string(steps) + ", hits " + std::to_string(all.prefix_hit_tokens) +
      ", preemptions " + std::to_string(all.preemptions) + ", forks " + std::to_string(all.forks) +
      ", truncations " + std::to_string(all.truncations) + ", window frees " +
      std::to_string(all.window_blocks_freed) + ", branch windows given back " +
      std::to_string(all.branch_blocks_given_back) + ", remembered branches kept " +
      std::to_string(all.remembered_branches_kept) + ", rolling states given back " +
      std::to_string(all.rolling_states_given_back) + ", coverage demotions " +
      std::to_string(all.coverage_demotions) + ", checkpoint hits " +
      std::to_string(all.checkpoint_hits) + ", encoder reuses " +
      std::to_string(all.cross_attention_reuses) + ", slabs reclaimed " +
      std::to_string(reclaimed) + ", compactions " + std::to_string(all.compactions) + " (" +
      std::to_string(all.pages_moved) + " pages moved, " +
      std::to_string(all.compactions_for_states) + " for states)";
  EXPECT_GE(steps, kStepsPerModel) << what;
  EXPECT_GT(all.prefix_hit_tokens, 0) << what;
  EXPECT_GT(all.preemptions, 0) << what;
  EXPECT_GT(all.forks, 0) << what;
  EXPECT_GT(all.truncations, 0) << what;
  EXPECT_GT(all.drafts_accepted, 0) << what;
  EXPECT_EQ(all.window_blocks_freed > 0, windows) << what;
  // Windows kept at branch points were given back to let allocations succeed, and every logit
  // still matched dense: the blocks went back to the cache and were reused without corruption.
  EXPECT_EQ(all.branch_blocks_given_back > 0, windows) << what;
  // With one pool, requests kept windows at branch points only the manager's memory showed (the
  // prefix evicted since), and every logit still matched dense.
  if (windows && one_pool) {
    EXPECT_GT(all.remembered_branches_kept, 0) << what;
  }
  EXPECT_EQ(all.checkpoint_hits > 0, state) << what;
  // Rolling recurrent states were given back so that steps fit (published as checkpoints, or
  // written over in place), and every logit still matched dense.
  EXPECT_EQ(all.rolling_states_given_back > 0, state) << what;
  // Checkpoints and attention blocks were demoted by coverage (evicted first, then reused for
  // other data) and every logit still matched dense.
  EXPECT_EQ(all.coverage_demotions > 0, state) << what;
  EXPECT_EQ(all.cross_attention_reuses > 0, cross) << what;
  // Recurrent models plan two-level memory: slabs moved between states and token pages while
  // every logit still matched dense, in one buffer where a slab given to two classes at once
  // would have corrupted one of them. Stranded pages were compacted: pages moved to other slabs
  // (the engine copying them, their old places poisoned) with every logit still equal to dense.
  if (state && windows == false) {
    EXPECT_GT(reclaimed, 0) << what;
    EXPECT_GT(all.compactions, 0) << what;
    EXPECT_GT(all.pages_moved, 0) << what;
  }
  // Some compactions were made for the states, whole slabs in every reduced recurrent model here
  // (CompactFor: only cache older than the state it spared dropped, the emptied slabs handed to
  // the states), and every logit still matched dense.
  if (state && windows == false) {
    EXPECT_GT(all.compactions_for_states, 0) << what;
  }
  RecordProperty("slabs_reclaimed", std::to_string(reclaimed));
  RecordProperty("branch_blocks_given_back", std::to_string(all.branch_blocks_given_back));
  RecordProperty("remembered_branches_kept", std::to_string(all.remembered_branches_kept));
  RecordProperty("rolling_states_given_back", std::to_string(all.rolling_states_given_back));
  RecordProperty("coverage_demotions", std::to_string(all.coverage_demotions));
  // Recurrent hits shorter than the block a one-page-size allocator would have to use for this
  // model: with padded pages they could not exist, here they ran and matched dense.
  if (state) {
    EXPECT_GT(padded_block, 0) << what;
    EXPECT_GT(shortest_hit, 0) << what;
    EXPECT_LT(shortest_hit, padded_block) << what;
    RecordProperty("shortest_checkpoint_hit", std::to_string(shortest_hit));
    RecordProperty("padded_block_tokens", std::to_string(padded_block));
  }
  RecordProperty("compactions", std::to_string(all.compactions));
  RecordProperty("pages_moved", std::to_string(all.pages_moved));
}

// The same workloads with and without compaction on Bamba (Mamba-2 states and attention pages
// from shared slabs): both equal dense, and compacting stranded pages between steps hands their
// slabs to the class that ran short, so fewer requests are preempted.
TEST(Engine, CompactionAvoidsPreemptionsAndStaysExact) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B", load);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  int64_t preemptions[2] = {0, 0}, compactions[2] = {0, 0}, moved = 0;
  // At the default budget rolling states given back leave nothing to preempt; two thirds of it
  // is short enough for preemptions with and without compaction.
  auto probe = RunVerify(*real, VerifyOptions{});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  const int64_t memory = probe->memory_bytes * 2 / 3;
  // Fewer preemptions is a claim over many seeds; under the sanitizers a few seeds show that both
  // runs stay exact and that compaction moved pages.
  const uint64_t seeds = testing::kSanitized ? 4 : 30;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    for (int on = 0; on < 2; ++on) {
      VerifyOptions o;
      o.seed = seed;
      o.memory_bytes = memory;
      o.compact = on == 1;
      auto r = RunVerify(*real, o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->completed) << "seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << "seed " << seed << (on ? " with" : " without")
                                  << " compaction";
      preemptions[on] += r->features.preemptions;
      compactions[on] += r->features.compactions;
      if (on == 1) moved += r->features.pages_moved;
    }
  }
  EXPECT_EQ(compactions[0], 0);
  EXPECT_GT(compactions[1], 0);
  EXPECT_GT(moved, 0);
  if (!testing::kSanitized) {
    EXPECT_LT(preemptions[1], preemptions[0]);
  }
  RecordProperty("preemptions_without_compaction", std::to_string(preemptions[0]));
  RecordProperty("preemptions_with_compaction", std::to_string(preemptions[1]));
}

// RunVerify on the three recurrent hybrids, seeds 1..`seeds`, with checkpoints admitted by
// expected reuse (ManagerConfig::prompt_checkpoints off, what the simulator's modes run) and
// `memory_share` of the verify budget: every run completes with every logit equal to dense.
// Returns, per model, the sum over its seeds of each counter in `counted`.
std::vector<std::vector<int64_t>> RecurrentRunsExact(
    uint64_t seeds, double memory_share, std::initializer_list<int64_t EngineCounters::*> counted) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  std::vector<std::vector<int64_t>> sums;
  for (const char* name :
       {"ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1", "Qwen--Qwen3-Next-80B-A3B-Instruct"}) {
    auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name, load);
    EXPECT_TRUE(real.ok()) << real.status().ToString();
    std::vector<int64_t>& sum = sums.emplace_back(counted.size(), 0);
    if (!real.ok()) continue;
    int64_t memory = 0;
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      VerifyOptions o;
      o.seed = seed;
      o.prompt_checkpoints = false;
      if (memory_share != 1 && memory == 0) {
        memory = static_cast<int64_t>(
            static_cast<double>(RunVerify(*real, o).value().memory_bytes) * memory_share);
      }
      o.memory_bytes = memory;
      auto r = RunVerify(*real, o);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) continue;
      EXPECT_TRUE(r->completed) << name << " seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << name << " seed " << seed;
      size_t k = 0;
      for (int64_t EngineCounters::*c : counted)
        sum[k++] += r->features.*c;
    }
  }
  return sums;
}

// Recurrent checkpoints admitted by expected reuse: no prompt-end checkpoints, only branch points
// and the states requests end with. Every logit still equals dense, and hits on checkpoints still
// happen.
TEST(Engine, CheckpointsAdmittedByExpectedReuseStayExact) {
  const auto sums =
      RecurrentRunsExact(testing::kSanitized ? 2 : 6, 1.0, {&EngineCounters::checkpoint_hits});
  for (size_t m = 0; m < sums.size(); ++m)
    EXPECT_GT(sums[m][0], 0) << "model " << m;
}

// Rolling states under pressure (ManagerConfig::rolling_stride_after_give_back): a request that
// gave its rolling state back keeps its next ones only every few blocks. Every logit still equals
// dense, and the rule changes the run: fewer give-backs than with a rolling state at every block.
TEST(Engine, RollingStatesAtAStrideAfterAGiveBackStayExact) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  const uint64_t seeds = testing::kSanitized ? 1 : 4;
  for (const char* name :
       {"ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1", "Qwen--Qwen3-Next-80B-A3B-Instruct"}) {
    auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name, load);
    ASSERT_TRUE(real.ok()) << real.status().ToString();
    int64_t with = 0, without = 0, memory = 0;
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      VerifyOptions o;
      o.seed = seed;
      // Half the default budget (about three of the longest sequences): rolling states are given
      // back often enough to see the rule.
      if (memory == 0) memory = RunVerify(*real, o).value().memory_bytes / 2;
      o.memory_bytes = memory;
      o.rolling_stride_after_give_back = 16;
      auto r = RunVerify(*real, o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->completed) << name << " seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << name << " seed " << seed;
      with += r->features.rolling_states_given_back;
      o.rolling_stride_after_give_back = 0;
      auto lru = RunVerify(*real, o);
      ASSERT_TRUE(lru.ok()) << lru.status().ToString();
      without += lru->features.rolling_states_given_back;
    }
    EXPECT_GT(with, 0) << name;
    EXPECT_LT(with, without) << name;
  }
}

// A manager rule under pressure (an eviction order, an admission rule), turned on by `rule`: at
// `share` of the verify budget, on four models (full attention, sliding window, two recurrent
// hybrids) and several seeds, every logit still equals dense, the rule acted (`acted` counts it in
// the engine's counters), and the run is really another one: some run hits a different number of
// tokens than without the rule.
void ExpectRuleUnderPressureExact(const std::function<void(VerifyOptions&)>& rule,
                                  int64_t EngineCounters::*acted, double share = 0.5) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  const uint64_t seeds = testing::kSanitized ? 2 : 4;
  for (const char* name : {"meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                           "ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1"}) {
    auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name, load);
    ASSERT_TRUE(real.ok()) << real.status().ToString();
    bool differs = false;
    int64_t acts = 0, memory = 0;
    // A small workload may not reach the rule's effect in the first seeds: go on, up to 8, until
    // it shows.
    for (uint64_t seed = 1; seed <= seeds || (!differs && seed <= 8); ++seed) {
      VerifyOptions o;
      o.seed = seed;
      o.prompt_checkpoints = false;
      // Below the default budget: cached blocks compete with newer ones for memory.
      if (memory == 0) {
        memory = static_cast<int64_t>(
            static_cast<double>(RunVerify(*real, o).value().memory_bytes) * share);
      }
      o.memory_bytes = memory;
      auto lru = RunVerify(*real, o);
      ASSERT_TRUE(lru.ok()) << lru.status().ToString();
      rule(o);
      auto r = RunVerify(*real, o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->completed) << name << " seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << name << " seed " << seed;
      acts += r->features.*acted;
      differs = differs || r->features.prefix_hit_tokens != lru->features.prefix_hit_tokens;
    }
    EXPECT_GT(acts, 0) << name;
    EXPECT_TRUE(differs) << name << ": the rule changed no hit";
  }
}

// A request that computes blocks or checkpoints a free block still caches (a recurrent model
// whose state at the end of the cached KV is gone computes that KV again) takes their keys over
// (BlockPool::Publish): requests hit the newer copies, which the engine wrote, and every logit
// still equals dense. At half the verify memory, so that states are evicted.
TEST(Engine, RecomputedPrefixesTakeTheirKeysOverAndStayExact) {
  const auto sums =
      RecurrentRunsExact(testing::kSanitized ? 2 : 4, 0.5,
                         {&EngineCounters::keys_taken_over, &EngineCounters::prefix_hit_tokens});
  for (size_t m = 0; m < sums.size(); ++m) {
    EXPECT_GT(sums[m][0], 0) << "model " << m;
    EXPECT_GT(sums[m][1], 0) << "model " << m;
  }
}

// Compaction for one class (CompactionDue, KvCacheManager::CompactFor) drops only cache older than
// what that class would evict and moves the younger cached pages of the slabs it empties; token
// classes mostly caching take slabs from the states the same way. The engine copies every moved
// page, and requests later hit the moved pages: every logit equals dense.
TEST(Engine, CompactionMovesYoungerCacheAndStaysExact) {
  // Twice the default budget: token pages mostly cache (at the default, running requests hold
  // most of them and only the states compact for their cache).
  const std::vector<std::vector<int64_t>> sums = RecurrentRunsExact(
      6, 2.0,
      {&EngineCounters::cached_pages_moved, &EngineCounters::compactions_for_cache,
       &EngineCounters::compactions_for_states, &EngineCounters::prefix_hit_tokens});
  int64_t cached = 0, for_cache = 0, for_states = 0;
  for (size_t m = 0; m < sums.size(); ++m) {
    cached += sums[m][0];
    for_cache += sums[m][1];
    for_states += sums[m][2];
    EXPECT_GT(sums[m][3], 0) << "model " << m;
    RecordProperty("cached_pages_moved_" + std::to_string(m), std::to_string(sums[m][0]));
  }
  EXPECT_GT(cached, 0);
  EXPECT_GT(for_cache, 0);
  EXPECT_GT(for_states, 0);
}

// Shared prefixes kept longer (ManagerConfig::branch_bonus): the prefixes requests branched from,
// and their checkpoints, queue behind blocks freed after them; the manager marked some.
TEST(Engine, SharedPrefixesKeptLongerStayExact) {
  ExpectRuleUnderPressureExact([](VerifyOptions& o) { o.branch_bonus = 1; },
                               &EngineCounters::shared_prefixes_marked);
}

// The thrash guard (ManagerConfig::thrash_guard) with a fixed share: 15 of 16 finished
// requests' blocks - token blocks and recurrent checkpoints - go on probation, evicted before
// older blocks yet still serving hits until then; the manager put some there.
TEST(Engine, ThrashGuardProbationStaysExact) {
  ExpectRuleUnderPressureExact(
      [](VerifyOptions& o) {
        o.thrash_guard = true;
        o.thrash_keep_share = 1.0 / 16;
      },
      &EngineCounters::thrash_probation_frees, 0.4);
}

// Admission headroom (ManagerConfig::admission_headroom_steps): a request is admitted only if the
// running ones could still decode 16 more steps in what stays free; admissions were held back for
// the headroom alone (the simulator's tests show what that buys under load).
TEST(Engine, AdmissionHeadroomHoldsAdmissionsBackAndStaysExact) {
  ExpectRuleUnderPressureExact([](VerifyOptions& o) { o.admission_headroom_steps = 16; },
                               &EngineCounters::admissions_held_for_headroom);
}

// An eviction order unrelated to recency (ManagerConfig::eviction_rank, what the simulator's
// oracle mode evicts by): a fixed scramble of each block's digest, so a prefix's start may go
// before its end and a fresh block before a stale one. Every logit still equals dense, and the
// order is really another one: the engine hits a different number of tokens than with recency.
TEST(Engine, AnyEvictionOrderStaysExact) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  const uint64_t seeds = testing::kSanitized ? 2 : 4;
  for (const char* name : {"meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                           "ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1"}) {
    auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name, load);
    ASSERT_TRUE(real.ok()) << real.status().ToString();
    bool differs = false;
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      VerifyOptions o;
      o.seed = seed;
      o.eviction_rank = std::make_shared<testing::ScrambledRank>();
      auto r = RunVerify(*real, o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->completed) << name << " seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << name << " seed " << seed;
      if (differs) continue;
      o.eviction_rank = nullptr;
      auto lru = RunVerify(*real, o);
      ASSERT_TRUE(lru.ok()) << lru.status().ToString();
      differs = r->features.prefix_hit_tokens != lru->features.prefix_hit_tokens;
    }
    EXPECT_TRUE(differs) << name;
  }
}

// Batched steps with publishing at Allocate (VerifyOptions::batched), as the simulator models
// vLLM's engine: each step allocates every scheduled request, then runs them in order; requests
// admitted together share system prompts, so later ones hit blocks earlier ones compute in the
// same batch. Every logit still equals dense, with freed blocks poisoned, drafts, forks and
// preemptions as in every verify run.
TEST(Engine, BatchedStepsPublishingAtAllocateStayExact) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  const uint64_t seeds = testing::kSanitized ? 1 : 4;
  for (const char* name :
       {"meta-llama--Llama-3.1-8B", "google--gemma-2-9b", "openai--gpt-oss-20b",
        "meta-llama--Llama-4-Scout-17B-16E-Instruct", "ibm-ai-platform--Bamba-9B"}) {
    auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name, load);
    ASSERT_TRUE(real.ok()) << real.status().ToString();
    int64_t hits = 0;
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      VerifyOptions o;
      o.seed = seed;
      o.batched = true;
      auto r = RunVerify(*real, o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->completed) << name << " seed " << seed;
      EXPECT_EQ(r->mismatches, 0) << name << " seed " << seed;
      hits += r->features.prefix_hit_tokens;
    }
    EXPECT_GT(hits, 0) << name;
  }
}

TEST(Engine, RejectsBadRequestsWithoutQueueingThem) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B", load);
  ASSERT_TRUE(real.ok());
  const ModelSpec spec = ScaleModel(*real, {}).value();
  const ModelWeights weights = ModelWeights::Random(spec, 97, 1);
  PlanOptions po;
  po.memory_bytes = int64_t{1} << 20;
  po.block_tokens = 4;
  po.max_model_len = 128;
  const Plan plan = MakePlan(spec, po).value();
  const ManagerConfig config = ManagerConfig::FromPlan(plan).value();
  const auto refused = [&](EngineOptions o, const char* what) {
    const Status st = Engine::Create(spec, weights, plan, config, o).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  EngineOptions o;
  o.token_budget = 0;
  refused(o, "token budget 0");
  o = {};
  o.lookahead = -1;
  refused(o, "lookahead -1");
  // Sparse KV: no speculative drafts (a request that evicted cannot roll back), and the
  // policy's options are checked.
  o = {};
  o.draft_tokens = 2;
  o.sparse = SparseKvOptions{};
  refused(o, "2 draft tokens");
  o = {};
  o.sparse = SparseKvOptions{};
  o.sparse->policy.kind = PolicyKind::kSnapKv;
  o.sparse->policy.kernel = 4;
  refused(o, "kernel");
  auto engine = Engine::Create(spec, weights, plan, config, {}).value();
  GenerationRequest bad;
  bad.id = 1;
  bad.prompt = {3, 97};
  Status s = engine->Submit(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token 97 at position 1"), std::string::npos) << s.message();
  bad.prompt = {};
  EXPECT_EQ(engine->Submit(bad).code(), StatusCode::kInvalidArgument);
  bad.prompt = {3};
  bad.encoder = {5, 4};  // an image for a model without cross attention
  s = engine->Submit(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4 encoder tokens"), std::string::npos) << s.message();
  EXPECT_TRUE(engine->idle());
  GenerationRequest a;
  a.id = 10;
  a.prompt = {1, 2, 3};
  a.num_samples = 3;  // ids 10, 11, 12
  ASSERT_TRUE(engine->Submit(a).ok());
  GenerationRequest b = a;
  b.id = 12;
  b.num_samples = 1;
  s = engine->Submit(b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  b.id = 13;
  EXPECT_TRUE(engine->Submit(b).ok());
  while (!engine->idle())
    ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->finished().size(), 4u);  // 10, its two siblings, and 13
}

INSTANTIATE_TEST_SUITE_P(Models, Verify, testing::kEngineModels, testing::ModelTestName);

}  // namespace
}  // namespace hkv
