// Allocator modes: the pools and groups each mode builds for real configs, worked out by hand
// from the configs (bytes per token, state bytes) and the rules in allocator_mode.h.
#include <string>

#include <gtest/gtest.h>

#include <hkv/manager/allocator_mode.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

ModelSpec Load(const std::string& name) {
  auto m = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

Allocator Make(const ModelSpec& m, AllocatorMode mode, AllocatorOptions o = {}) {
  auto a = MakeAllocator(m, mode, o);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : Allocator{};
}

constexpr int64_t k16GiB = int64_t{16} << 30;

TEST(AllocatorMode, Gemma2PaddedNeedsNoPaddingAndMatchesHybridKV) {
  const ModelSpec m = Load("google--gemma-2-9b");
  // 42 layers, 8 KV heads x 256 x (K, V) x 2 bytes = 8 KiB per token each; 21 sliding, 21 full.
  const int64_t page = 16 * 8192;
  const Allocator padded = Make(m, AllocatorMode::kPadded);
  EXPECT_EQ(padded.block_tokens, 16);
  ASSERT_EQ(padded.config.groups.size(), 2u);
  EXPECT_EQ(padded.pool_block_bytes, std::vector<int64_t>{21 * page});
  EXPECT_EQ(padded.config.pool_blocks,
            std::vector<int32_t>{static_cast<int32_t>(k16GiB / (21 * page))});
  EXPECT_FALSE(padded.config.coherent_eviction);
  const Allocator hybrid = Make(m, AllocatorMode::kHybridKV);
  EXPECT_EQ(hybrid.config.pool_blocks, padded.config.pool_blocks);
  EXPECT_TRUE(hybrid.config.coherent_eviction);
  const Allocator uniform = Make(m, AllocatorMode::kUniform);
  ASSERT_EQ(uniform.config.groups.size(), 1u);
  EXPECT_EQ(uniform.config.groups[0].rule.kind, TokenRuleKind::kAll);
  EXPECT_EQ(uniform.pool_block_bytes, std::vector<int64_t>{42 * page});
  EXPECT_TRUE(uniform.config.enable_prefix_caching);
}

TEST(AllocatorMode, BambaPaddedGrowsTheAttentionBlockAndPadsTheState) {
  const ModelSpec m = Load("ibm-ai-platform--Bamba-9B");
  // 3 attention layers of 4096 bytes per token; 29 Mamba-2 layers of 2,147,840 state bytes.
  // vLLM's rule: block = 16 * ceil(2147840 / (16 * 4096)) = 16 * 33 = 528 tokens, so one
  // attention page is 528 * 4096 = 2,162,688 bytes and the state page is padded up to it.
  const Allocator a = Make(m, AllocatorMode::kPadded);
  EXPECT_EQ(a.block_tokens, 528);
  EXPECT_EQ(a.state_page_bytes, 2162688);
  // Buckets of 3 and 29 layers: groups of 3 layer slots (29 < 1.5 * 3 is false), so one
  // attention group and ceil(29 / 3) = 10 state groups with 1 padding slot; a block is 3 pages.
  ASSERT_EQ(a.config.groups.size(), 11u);
  int state_groups = 0;
  for (const GroupConfig& g : a.config.groups) {
    state_groups += g.is_state();
    if (!g.is_state()) {
      EXPECT_EQ(g.block_tokens, 528);
    }
  }
  EXPECT_EQ(state_groups, 10);
  EXPECT_EQ(a.pool_block_bytes, std::vector<int64_t>{3 * 2162688});
  EXPECT_EQ(a.config.pool_blocks,
            std::vector<int32_t>{static_cast<int32_t>(k16GiB / (3 * 2162688))});
  EXPECT_EQ(a.config.align_tokens(), 528);

  // hybridkv: 16-token attention blocks, one state page for all 29 layers in its own pool.
  const Allocator h = Make(m, AllocatorMode::kHybridKV);
  EXPECT_EQ(h.block_tokens, 16);
  EXPECT_EQ(h.state_page_bytes, 29 * int64_t{2147840});
  EXPECT_EQ(h.config.pool_blocks.size(), 2u);
  EXPECT_EQ(h.config.align_tokens(), 16);

  // uniform: every layer an attention layer, and no prefix caching (no way to restore state).
  const Allocator u = Make(m, AllocatorMode::kUniform);
  EXPECT_EQ(u.pool_block_bytes, std::vector<int64_t>{16 * 32 * 4096});
  EXPECT_FALSE(u.config.enable_prefix_caching);
}

TEST(AllocatorMode, RefusalsNameTheProblem) {
  const ModelSpec m = Load("ibm-ai-platform--Bamba-9B");
  AllocatorOptions o;
  o.memory_bytes = 8 << 20;  // not two 6.19 MiB padded blocks
  auto a = MakeAllocator(m, AllocatorMode::kPadded, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("padded"), std::string::npos) << a.status().ToString();
  o = {};
  o.max_model_len = 512;  // below the 528-token padded block
  a = MakeAllocator(m, AllocatorMode::kPadded, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("528"), std::string::npos) << a.status().ToString();
  o = {};
  o.block_tokens = 0;
  EXPECT_FALSE(MakeAllocator(m, AllocatorMode::kHybridKV, o).ok());
  o = {};
  o.planning_tokens = o.max_model_len + 1;
  EXPECT_FALSE(MakeAllocator(m, AllocatorMode::kHybridKV, o).ok());
  EXPECT_FALSE(ParseAllocatorMode("vllm").ok());
  for (AllocatorMode mode : kAllAllocatorModes)
    EXPECT_EQ(ParseAllocatorMode(AllocatorModeName(mode)).value(), mode);
}

}  // namespace
}  // namespace hkv
