// Allocator modes: the pools and groups each mode builds for real configs, worked out by hand
// from the configs (bytes per token, state bytes) and the rules in allocator_mode.h.
#include <algorithm>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include <hkv/manager/allocator_mode.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

ModelSpec Load(const std::string& name) {
  auto m = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// The options these tests were written for: a 16 GiB budget, 16-token blocks, 16384 tokens.
PlanOptions Options() {
  PlanOptions o;
  o.max_model_len = 16384;
  return o;
}

Allocator Make(const ModelSpec& m, AllocatorMode mode, PlanOptions o = Options()) {
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

TEST(AllocatorMode, PerSequenceFiguresOnBambaByHand) {
  const ModelSpec m = Load("ibm-ai-platform--Bamba-9B");
  // 3 attention layers of 4096 bytes per token, 29 Mamba-2 states of 2,147,840 bytes
  // (62,287,360 per sequence). One sequence of 4096 tokens ideally holds
  // 4096 * 3 * 4096 + 62,287,360 = 50,331,648 + 62,287,360 = 112,619,008 bytes.
  const int64_t ideal = 112619008;
  EXPECT_EQ(IdealBytes(m, 4096, 0), ideal);

  // uniform: 32 layers x 4096 = 131,072 bytes per token, 16-token blocks of 2 MiB; 4096 tokens
  // are 256 blocks = 512 MiB. 16 GiB holds 8192 blocks, one of them the null block:
  // 8191 / 256 = 31 sequences.
  const Allocator u = Make(m, AllocatorMode::kUniform);
  EXPECT_EQ(u.BlocksPerSequence(4096, 0), std::vector<int64_t>{256});
  EXPECT_EQ(u.BytesPerSequence(4096, 0), 256 * 2097152);
  EXPECT_EQ(u.MaxSequences(4096, 0), 31);
  EXPECT_DOUBLE_EQ(u.Waste(m, 4096, 0), static_cast<double>(536870912 - ideal) / 536870912.0);

  // padded: a block is 3 slots of 2,162,688 bytes = 6,488,064. The attention group holds
  // ceil(4096 / 528) = 8 blocks, each of the 10 state groups one: 18 blocks = 116,785,152 bytes.
  // 16 GiB / 6,488,064 = 2647 blocks; 2646 / 18 = 147 sequences.
  const Allocator p = Make(m, AllocatorMode::kPadded);
  EXPECT_EQ(p.BlocksPerSequence(4096, 0), std::vector<int64_t>{18});
  EXPECT_EQ(p.BytesPerSequence(4096, 0), 116785152);
  EXPECT_EQ(p.MaxSequences(4096, 0), 147);
  EXPECT_DOUBLE_EQ(p.Waste(m, 4096, 0), static_cast<double>(116785152 - ideal) / 116785152.0);
  // One token still costs a whole 528-token block and all 10 state groups.
  EXPECT_EQ(p.BytesPerSequence(1, 0), 11 * 6488064);

  // hybridkv: 256 attention pages of 16 x 3 x 4096 = 196,608 bytes and one state page of
  // 62,287,360: exactly the ideal, no waste.
  const Allocator h = Make(m, AllocatorMode::kHybridKV);
  ASSERT_EQ(h.pool_block_bytes.size(), 2u);
  const size_t attn = h.pool_block_bytes[0] == 196608 ? 0 : 1;
  EXPECT_EQ(h.pool_block_bytes[attn], 196608);
  EXPECT_EQ(h.pool_block_bytes[1 - attn], 62287360);
  std::vector<int64_t> need(2);
  need[attn] = 256;
  need[1 - attn] = 1;
  EXPECT_EQ(h.BlocksPerSequence(4096, 0), need);
  // Two-level: 16 GiB buys 275 slabs of one state page (62,287,360 bytes), each also 316
  // attention pages with a 157,248-byte tail, so a page costs 62,287,360 / 316 bytes.
  ASSERT_TRUE(h.config.arena.enabled());
  EXPECT_EQ(h.slab_bytes, 62287360);
  EXPECT_EQ(h.config.arena.num_slabs, 275);
  EXPECT_EQ(h.config.arena.pages_per_slab[attn], 316);
  EXPECT_EQ(h.BytesPerSequence(4096, 0), 256 * int64_t{62287360} / 316 + 62287360);
  EXPECT_LE(h.Waste(m, 4096, 0), 0.003);
  // n sequences take n state slabs and ceil(256 n / 316) attention slabs: 151 + 123 = 274 <= 275
  // (152 would take 276). A fixed split sized at 16,384 tokens stops at its 65 state pages.
  EXPECT_EQ(h.MaxSequences(4096, 0), 151);
}

TEST(AllocatorMode, PerSequenceFiguresOnGemma2WindowsByHand) {
  const ModelSpec m = Load("google--gemma-2-9b");
  // 21 full and 21 sliding (window 4096) layers of 8192 bytes per token; T = 10001 tokens.
  // Full layers hold ceil(10001 / 16) = 626 blocks; the window keeps positions [5905, 10001),
  // blocks 369..625 = 257 blocks. Ideal: 21 * 8192 * (10001 + 4096) = 2,425,135,104 bytes.
  const int64_t t = 10001;
  const int64_t ideal = 2425135104;
  EXPECT_EQ(IdealBytes(m, t, 0), ideal);
  // uniform: 626 blocks of 16 x 42 x 8192 = 5,505,024 bytes.
  const Allocator u = Make(m, AllocatorMode::kUniform);
  EXPECT_EQ(u.BytesPerSequence(t, 0), 626 * int64_t{5505024});
  // padded and hybridkv: two groups of 21 layers, blocks of 21 x 16 x 8192 = 2,752,512 bytes,
  // (626 + 257) blocks.
  for (AllocatorMode mode : {AllocatorMode::kPadded, AllocatorMode::kHybridKV}) {
    const Allocator a = Make(m, mode);
    EXPECT_EQ(a.BlocksPerSequence(t, 0), std::vector<int64_t>{883}) << AllocatorModeName(mode);
    EXPECT_EQ(a.BytesPerSequence(t, 0), 883 * int64_t{2752512}) << AllocatorModeName(mode);
    EXPECT_DOUBLE_EQ(a.Waste(m, t, 0), static_cast<double>(883 * int64_t{2752512} - ideal) /
                                           static_cast<double>(883 * int64_t{2752512}));
    // 16 GiB / 2,752,512 = 6241 blocks; 6240 / 883 = 7.
    EXPECT_EQ(a.MaxSequences(t, 0), 7) << AllocatorModeName(mode);
  }
}

TEST(AllocatorMode, UniformGivesEncoderTokensASlotInEveryLayer) {
  const ModelSpec m = Load("meta-llama--Llama-3.2-11B-Vision");
  // 32 self-attention and 8 cross-attention layers of 4096 bytes per token: a uniform block is
  // 16 x 40 x 4096 = 2,621,440 bytes. 43 decoder and 6404 encoder tokens (the RFC's case) take
  // ceil(43 / 16) + ceil(6404 / 16) = 3 + 401 blocks in two block tables: one block more than
  // the plan's uniform figure, which packs all 6447 tokens into ceil(6447 / 16) = 403 blocks.
  const Allocator u = Make(m, AllocatorMode::kUniform);
  ASSERT_EQ(u.config.groups.size(), 2u);
  EXPECT_TRUE(u.config.groups[1].is_encoder());
  EXPECT_EQ(u.config.max_encoder_tokens, 6404);
  EXPECT_TRUE(u.config.Validate().ok());
  EXPECT_EQ(u.BytesPerSequence(43, 6404), 404 * int64_t{2621440});
  // Ideal: 43 * 32 * 4096 + 6404 * 8 * 4096 = 5,636,096 + 209,846,272 = 215,482,368.
  EXPECT_EQ(IdealBytes(m, 43, 6404), 215482368);
  EXPECT_NEAR(u.Waste(m, 43, 6404), 1.0 - 215482368.0 / (404 * 2621440.0), 1e-12);
  EXPECT_NEAR(u.Waste(m, 43, 6404), 0.7965, 0.0001);
  // The padded mode's config names the encoder bound too, so a manager accepts it.
  const Allocator p = Make(m, AllocatorMode::kPadded);
  EXPECT_EQ(p.config.max_encoder_tokens, 6404);
  EXPECT_TRUE(p.config.Validate().ok());
  PlanOptions o = Options();
  o.encoder_tokens = 100;
  EXPECT_EQ(Make(m, AllocatorMode::kUniform, o).config.max_encoder_tokens, 100);
  o.encoder_tokens = -2;
  const Status negative = MakeAllocator(m, AllocatorMode::kUniform, o).status();
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("encoder_tokens -2: expected -1"), std::string::npos)
      << negative.message();
  o.encoder_tokens = 100;
  const Status no_cross =
      MakeAllocator(Load("google--gemma-2-9b"), AllocatorMode::kPadded, o).status();
  EXPECT_EQ(no_cross.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_cross.message().find("encoder_tokens 100:"), std::string::npos)
      << no_cross.message();
  EXPECT_NE(no_cross.message().find("has no cross attention; expected -1 or 0"), std::string::npos)
      << no_cross.message();
}

TEST(AllocatorMode, HybridKVFiguresEqualThePlansFootprint) {
  // The plan computes its footprint from its own groups and classes (src/plan/capacity.cc); the
  // allocator only from its ManagerConfig. Both must agree for every bundled model, and the
  // uniform mode must match the plan's uniform figure when there are no encoder tokens.
  for (const char* name :
       {"Qwen--Qwen3-Next-80B-A3B-Instruct", "ai21labs--Jamba-v0.1",
        "deepseek-ai--DeepSeek-V2-Lite", "google--gemma-2-9b", "google--gemma-3-4b-it",
        "google--gemma-3n-E4B-it", "ibm-ai-platform--Bamba-9B", "meta-llama--Llama-3.1-8B",
        "meta-llama--Llama-3.2-11B-Vision", "meta-llama--Llama-4-Scout-17B-16E-Instruct",
        "mistralai--Ministral-8B-Instruct-2410", "openai--gpt-oss-20b"}) {
    const ModelSpec m = Load(name);
    PlanOptions o = Options();
    o.seq_tokens = 4096;
    auto plan = MakePlan(m, o);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().ToString();
    const Allocator h = Make(m, AllocatorMode::kHybridKV, o);
    const Allocator u = Make(m, AllocatorMode::kUniform, o);
    const int64_t enc = plan->options.encoder_tokens;
    for (int64_t t : {1, 100, 1000, 4096, 10001, 16384}) {
      const Footprint f = plan->FootprintOf(t, enc);
      EXPECT_EQ(h.BytesPerSequence(t, enc), f.hybridkv_bytes) << name << " " << t;
      EXPECT_DOUBLE_EQ(h.Waste(m, t, enc), f.hybridkv_waste()) << name << " " << t;
      EXPECT_EQ(IdealBytes(m, t, enc), f.ideal_bytes) << name << " " << t;
      if (enc == 0) {
        EXPECT_EQ(u.BytesPerSequence(t, 0), f.uniform_bytes) << name << " " << t;
      }
      // The manager keeps block 0 of each pool as its null block; the plan counts every page.
      const int64_t plan_max = plan->MaxSequences(t, enc);
      const int64_t max = h.MaxSequences(t, enc);
      EXPECT_TRUE(max == plan_max || max == plan_max - 1) << name << " " << t;
    }
  }
}

// A hand-built allocator: a 16-token attention group in pool 0 (1 KiB blocks) and a state group
// in pool 1 (4 KiB blocks).
Allocator TwoPools(std::vector<int32_t> pool_blocks) {
  Allocator a;
  a.config.pool_blocks = std::move(pool_blocks);
  a.config.max_model_len = 1024;
  a.config.groups = {GroupConfig{TokenRule{TokenRuleKind::kAll, 0, 0}, 16, 0},
                     GroupConfig{TokenRule{TokenRuleKind::kState, 0, 0}, 0, 1}};
  a.pool_block_bytes = {1024, 4096};
  return a;
}

TEST(AllocatorMode, MaxSequencesWithAndWithoutSharedSlabs) {
  // 100 tokens: 7 attention blocks and 1 state block, 7 KiB + 4 KiB.
  Allocator a = TwoPools({81, 21});
  EXPECT_EQ(a.BlocksPerSequence(100, 0), (std::vector<int64_t>{7, 1}));
  EXPECT_EQ(a.BytesPerSequence(100, 0), 7 * 1024 + 4096);
  // Fixed pools: min(80 / 7, 20 / 1) = 11.
  EXPECT_EQ(a.MaxSequences(100, 0), 11);
  // The same blocks drawn from 10 shared slabs of 8 attention or 2 state blocks
  // (10 * 8 + 1 = 81, 10 * 2 + 1 = 21): n sequences take ceil(7n / 8) + ceil(n / 2) slabs;
  // n = 6: 6 + 3 = 9 fit, n = 7: 7 + 4 = 11 do not.
  a.config.arena.num_slabs = 10;
  a.config.arena.pages_per_slab = {8, 2};
  ASSERT_TRUE(a.config.Validate().ok());
  EXPECT_EQ(a.MaxSequences(100, 0), 6);
  // 1 token: 1 + 1 blocks; ceil(n / 8) + ceil(n / 2) <= 10 up to n = 16 (2 + 8); 17: 3 + 9.
  EXPECT_EQ(a.MaxSequences(1, 0), 16);
  // One slab: a single sequence of 100 tokens needs two (one per pool).
  a.config.pool_blocks = {9, 3};
  a.config.arena.num_slabs = 1;
  ASSERT_TRUE(a.config.Validate().ok());
  EXPECT_EQ(a.MaxSequences(100, 0), 0);
  EXPECT_EQ(a.MaxSequences(1, 0), 0);
}

TEST(AllocatorMode, ASequenceNeedingNoBlockIsUnbounded) {
  Allocator a;
  a.config.pool_blocks = {5};
  a.config.groups = {GroupConfig{TokenRule{TokenRuleKind::kEncoder, 0, 0}, 16, 0}};
  a.pool_block_bytes = {1024};
  EXPECT_EQ(a.BytesPerSequence(100, 0), 0);
  EXPECT_EQ(a.MaxSequences(100, 0), std::numeric_limits<int64_t>::max());
  EXPECT_DOUBLE_EQ(a.Waste(Load("meta-llama--Llama-3.2-11B-Vision"), 100, 0), 0.0);
  a.config.arena.num_slabs = 2;
  a.config.arena.pages_per_slab = {2};
  EXPECT_EQ(a.MaxSequences(100, 0), std::numeric_limits<int64_t>::max());
  // 40 encoder tokens: 3 blocks; 4 usable blocks hold 1 sequence, 2 slabs of 2 blocks too.
  EXPECT_EQ(a.MaxSequences(100, 40), 1);
  a.config.arena = {};
  EXPECT_EQ(a.MaxSequences(100, 40), 1);
  EXPECT_EQ(a.MaxSequences(100, -5), std::numeric_limits<int64_t>::max());
}

TEST(AllocatorMode, MaxModelLenZeroIsTheModelsOwnOrARefusal) {
  // 0 takes the config's max_position_embeddings, as a plan does; a config without one is
  // refused by name in every mode.
  ModelSpec m = Load("meta-llama--Llama-3.1-8B");
  PlanOptions o = Options();
  o.max_model_len = 0;
  for (AllocatorMode mode : kAllAllocatorModes)
    EXPECT_EQ(Make(m, mode, o).config.max_model_len, m.max_position_embeddings);
  m.max_position_embeddings = 0;
  for (AllocatorMode mode : kAllAllocatorModes) {
    const Status st = MakeAllocator(m, mode, o).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("max_model_len is 0 and"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("gives no max_position_embeddings"), std::string::npos);
  }
}

TEST(AllocatorMode, RefusalsNameTheProblem) {
  const ModelSpec m = Load("ibm-ai-platform--Bamba-9B");
  PlanOptions o = Options();
  o.memory_bytes = 8 << 20;  // not two 6.19 MiB padded blocks
  auto a = MakeAllocator(m, AllocatorMode::kPadded, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("padded"), std::string::npos) << a.status().ToString();
  o = Options();
  o.max_model_len = 512;  // below the 528-token padded block
  a = MakeAllocator(m, AllocatorMode::kPadded, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("528"), std::string::npos) << a.status().ToString();
  o = Options();
  o.block_tokens = 0;
  a = MakeAllocator(m, AllocatorMode::kHybridKV, o);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), "allocator: block_tokens 0: expected at least 1");
  o = Options();
  o.seq_tokens = o.max_model_len + 1;
  a = MakeAllocator(m, AllocatorMode::kHybridKV, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("seq_tokens 16385: expected 0 to max_model_len"),
            std::string::npos)
      << a.status().message();
  // Memory whose block metadata would not fit in memory is refused in every mode.
  o = Options();
  o.memory_bytes = int64_t{100} << 40;
  for (AllocatorMode mode : kAllAllocatorModes) {
    a = MakeAllocator(m, mode, o);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("16777216"), std::string::npos) << a.status().message();
  }
  // vllm is not one of hkv's allocator modes: it is the vllm part (hkv/vllm/).
  EXPECT_FALSE(ParseAllocatorMode("vllm").ok());
  for (AllocatorMode mode : kAllAllocatorModes)
    EXPECT_EQ(ParseAllocatorMode(AllocatorModeName(mode)).value(), mode);
}

}  // namespace
}  // namespace hkv
