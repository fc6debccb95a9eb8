// ManagerConfig: derivation from a Plan and validation.
#include <string>

#include <gtest/gtest.h>

#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

void ExpectInvalid(const ManagerConfig& c, const std::string& needle) {
  const Status s = c.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_FALSE(KvCacheManager::Create(c).ok());
}

TEST(ManagerConfig, ValidationNamesTheField) {
  ManagerConfig c = MakeConfig({16}, {Full(4)});
  EXPECT_TRUE(c.Validate().ok());
  ExpectInvalid(MakeConfig({}, {Full(4)}), "no pools");
  ExpectInvalid(MakeConfig({1}, {Full(4)}), "pool 0 has 1 blocks");
  ExpectInvalid(MakeConfig({16}, {}), "no groups");
  ExpectInvalid(MakeConfig({16}, {Full(4, 1)}), "group 0 uses pool 1");
  ExpectInvalid(MakeConfig({16}, {Full(0)}), "block_tokens 0");
  ExpectInvalid(MakeConfig({16}, {Window(0, 4)}), "span 0");
  ExpectInvalid(MakeConfig({16}, {GroupConfig{{TokenRuleKind::kState, 0, 0}, 4, 0}}), "must be 0");
  ExpectInvalid(MakeConfig({16}, {GroupConfig{{TokenRuleKind::kNothing, 0, 0}, 4, 0}}),
                "keeps nothing");
  ExpectInvalid(MakeConfig({16}, {Full(4)}, 0), "max_model_len 0");
  ManagerConfig enc = MakeConfig({16}, {Full(4), Encoder(4)});
  enc.max_encoder_tokens = 0;
  ExpectInvalid(enc, "max_encoder_tokens");
  ManagerConfig ckpt = MakeConfig({16}, {Full(4), Window(8, 8)});
  ckpt.checkpoint_interval = 12;
  ExpectInvalid(ckpt, "checkpoint_interval 12");
  ManagerConfig stride = MakeConfig({16}, {Full(4), Window(8, 8)});
  stride.rolling_stride_after_give_back = 12;
  ExpectInvalid(stride, "rolling_stride_after_give_back 12");
  stride.rolling_stride_after_give_back = -8;
  ExpectInvalid(stride, "rolling_stride_after_give_back -8");
  stride.rolling_stride_after_give_back = 16;
  EXPECT_TRUE(stride.Validate().ok()) << stride.Validate().ToString();
  ManagerConfig memory = MakeConfig({16}, {Full(4), Window(8, 4)});
  memory.branch_memory_entries = -1;
  ExpectInvalid(memory, "branch_memory_entries -1");
  memory.branch_memory_entries = (1 << 24) + 1;
  ExpectInvalid(memory, "branch_memory_entries 16777217");
  memory.branch_memory_entries = 0;
  EXPECT_TRUE(memory.Validate().ok()) << memory.Validate().ToString();
  ExpectInvalid(MakeConfig({16}, {Full(1009), Window(8, 1013), Chunk(8, 1019)}), "lcm");
  // Two-level memory: 3 slabs of 5 pages make a pool of 16 blocks.
  ManagerConfig arena = MakeConfig({16}, {Full(4)});
  arena.arena = {3, {5}};
  EXPECT_TRUE(arena.Validate().ok()) << arena.Validate().ToString();
  arena.arena.pages_per_slab = {0};
  ExpectInvalid(arena, "arena.pages_per_slab[0] = 0: expected >= 1");
  arena.arena.pages_per_slab = {4};
  ExpectInvalid(arena, "pool 0 has 16 blocks: expected num_slabs * pages_per_slab + 1 = 13");
}

TEST(ManagerConfig, DerivedAlignment) {
  EXPECT_EQ(MakeConfig({16}, {Full(16), Window(8, 32)}).align_tokens(), 32);
  EXPECT_EQ(MakeConfig({16}, {Full(16), Window(8, 24)}).hash_tokens(), 8);
  EXPECT_EQ(MakeConfig({16}, {Full(16), Window(8, 24)}).align_tokens(), 48);
  ManagerConfig state_only = MakeConfig({16}, {StateGroup()});
  state_only.state_align_tokens = 64;
  EXPECT_EQ(state_only.align_tokens(), 64);
  EXPECT_EQ(state_only.hash_tokens(), 64);
}

TEST(ManagerConfig, FromPlanOfARealHybridModel) {
  auto model = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/ai21labs--Jamba-v0.1/config.json");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  PlanOptions opts;
  opts.memory_bytes = int64_t{8} << 30;
  opts.max_model_len = 8192;
  auto plan = MakePlan(*model, opts);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto c = ManagerConfig::FromPlan(*plan);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->groups.size(), plan->groups.size());
  EXPECT_EQ(c->pool_blocks.size(), plan->page_classes.size());
  bool has_state = false;
  for (const GroupConfig& g : c->groups)
    has_state = has_state || g.is_state();
  EXPECT_TRUE(has_state);
  EXPECT_EQ(c->max_model_len, plan->options.max_model_len);
  EXPECT_TRUE(KvCacheManager::Create(*c).ok());
}

// A config that does not describe the plan's memory is named by its first difference; the one
// FromPlan made, and one with fewer blocks than the plan's pages, match.
TEST(ManagerConfig, CheckMatchesNamesWhereConfigAndPlanDiffer) {
  for (const char* name : {"google--gemma-2-9b", "ibm-ai-platform--Bamba-9B"}) {
    SCOPED_TRACE(name);
    auto model = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    PlanOptions opts;
    opts.memory_bytes = int64_t{4} << 30;
    opts.max_model_len = 8192;
    const Plan plan = MakePlan(*model, opts).value();
    const ManagerConfig good = ManagerConfig::FromPlan(plan).value();
    EXPECT_TRUE(good.CheckMatches(plan).ok());
    ManagerConfig smaller = good;
    smaller.pool_blocks[0] -= 1;
    EXPECT_TRUE(smaller.CheckMatches(plan).ok());

    const auto refused = [&](ManagerConfig c, const std::string& what) {
      const Status s = c.CheckMatches(plan);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
      EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    };
    ManagerConfig c = good;
    c.groups.pop_back();
    refused(c, std::to_string(good.groups.size() - 1) + " groups; the plan has " +
                   std::to_string(plan.groups.size()));
    c = good;
    c.groups[0].rule.kind =
        c.groups[0].rule.kind == TokenRuleKind::kAll ? TokenRuleKind::kWindow : TokenRuleKind::kAll;
    refused(c, "group 0 keeps tokens by another rule than the plan's");
    const size_t tokens = plan.groups[0].block_tokens > 0 ? 0 : 1;
    c = good;
    c.groups[tokens].block_tokens *= 2;
    refused(c, "group " + std::to_string(tokens) + " has " +
                   std::to_string(2 * good.groups[tokens].block_tokens) +
                   "-token blocks; the plan's has " +
                   std::to_string(good.groups[tokens].block_tokens));
    c = good;
    c.groups[0].pool += 1;
    refused(c, "group 0 draws from pool " + std::to_string(good.groups[0].pool + 1));
    c = good;
    c.pool_blocks.push_back(16);
    refused(c, std::to_string(good.pool_blocks.size() + 1) + " pools; the plan has " +
                   std::to_string(plan.page_classes.size()) + " page classes");
    c = good;
    c.pool_blocks[0] += 1;
    refused(c, "pool 0 has " + std::to_string(good.pool_blocks[0] + 1) +
                   " blocks; the plan's page class holds " + std::to_string(good.pool_blocks[0]));
    if (plan.arena.enabled()) {
      c = good;
      c.arena.num_slabs += 1;
      refused(c, std::to_string(good.arena.num_slabs + 1) + " shared slabs; the plan has " +
                     std::to_string(plan.arena.num_slabs));
      c = good;
      c.arena.pages_per_slab[0] += 1;
      refused(c, "pool 0 is not carved");
    } else {
      c = good;
      c.arena.num_slabs = 2;
      c.arena.pages_per_slab.assign(c.pool_blocks.size(), 1);
      refused(c, "2 shared slabs; the plan has none");
    }
  }
}

}  // namespace
}  // namespace hkv::testing
