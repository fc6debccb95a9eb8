// vLLM's grouping, block sizes and block counts for the bundled models, worked out by hand from
// the configs and vLLM's rules (see kv_cache_config.h); ../shared/vllm_reference prints the same
// groups for its configs of the same names.
#include <gtest/gtest.h>

#include <hkv/spec/config_loader.h>
#include <hkv/vllm/kv_cache_config.h>

namespace hkv::vllm {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

ModelSpec Load(const char* name) {
  return LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name).value();
}

KvCacheOptions Gib(double gib, MambaCacheMode mode = MambaCacheMode::kAuto) {
  KvCacheOptions o;
  o.memory_bytes = static_cast<int64_t>(gib * static_cast<double>(kGiB));
  o.mamba_cache_mode = mode;
  return o;
}

TEST(VllmConfig, LlamaIsOneGroupOfEveryLayer) {
  const KvCacheConfig c = MakeKvCacheConfig(Load("meta-llama--Llama-3.1-8B"), Gib(16)).value();
  ASSERT_EQ(c.groups.size(), 1u);
  EXPECT_EQ(c.groups[0].layers.size(), 32u);
  EXPECT_EQ(c.groups[0].spec.block_size, 16);
  // 16 tokens x 8 KV heads x (128 + 128) x 2 bytes.
  EXPECT_EQ(c.page_size_bytes, 65536);
  EXPECT_EQ(c.num_blocks, 16 * kGiB / 65536 / 32);  // 8192
  EXPECT_EQ(c.hash_block_size, 16);
  EXPECT_FALSE(c.mamba_block_aligned_split());
}

TEST(VllmConfig, BambaAllModeRoundsTheBlockToTheMambaChunk) {
  // Mamba-2 state: conv 3 x (8192 + 2 x 128) + ssm 128 x 64 x 128, bf16 = 2,147,840 bytes;
  // attention 4096 bytes per token: 525 tokens, rounded up to the chunk (256): 768.
  const KvCacheConfig c = MakeKvCacheConfig(Load("ibm-ai-platform--Bamba-9B"), Gib(8)).value();
  EXPECT_EQ(c.mamba_cache_mode, MambaCacheMode::kAll);
  EXPECT_EQ(c.cache_block_size, 768);
  // Buckets in first-seen order: 29 Mamba layers (layer 0 is Mamba), 3 attention layers; groups
  // of 3: 10 Mamba groups (layers i, i+10, i+20 of the bucket; the last one short), then one.
  ASSERT_EQ(c.groups.size(), 11u);
  EXPECT_EQ(c.groups[0].spec.type, SpecType::kMamba);
  EXPECT_EQ(c.groups[0].spec.block_size, 768);
  EXPECT_EQ(c.groups[0].layers.size(), 3u);
  EXPECT_EQ(c.groups[9].layers.size(), 2u);
  EXPECT_EQ(c.groups[10].spec.type, SpecType::kFullAttention);
  EXPECT_EQ(c.groups[10].layers.size(), 3u);
  EXPECT_EQ(c.page_size_bytes, 768 * 4096);
  EXPECT_EQ(c.num_blocks, 8 * kGiB / (768 * 4096) / 3);
  EXPECT_EQ(c.hash_block_size, 768);
  EXPECT_FALSE(c.mamba_block_aligned_split());
}

TEST(VllmConfig, BambaAlignModeUsesTheKernelAlignment) {
  const KvCacheConfig c =
      MakeKvCacheConfig(Load("ibm-ai-platform--Bamba-9B"), Gib(8, MambaCacheMode::kAlign)).value();
  EXPECT_EQ(c.cache_block_size, 528);  // 16 x ceil(2,147,840 / (16 x 4096))
  EXPECT_EQ(c.page_size_bytes, 528 * 4096);
  EXPECT_EQ(c.groups[0].spec.page_size_padded, 528 * 4096);
  EXPECT_TRUE(c.mamba_block_aligned_split());
}

TEST(VllmConfig, GatedDeltaNetDefaultsToAlign) {
  // Qwen3-Next: state 1,097,728 bytes, attention 2 x (256 + 256) x 2 = 2048 bytes per token.
  const KvCacheConfig c =
      MakeKvCacheConfig(Load("Qwen--Qwen3-Next-80B-A3B-Instruct"), Gib(8)).value();
  EXPECT_EQ(c.mamba_cache_mode, MambaCacheMode::kAlign);
  EXPECT_EQ(c.cache_block_size, 544);
  EXPECT_EQ(c.page_size_bytes, 544 * 2048);
}

TEST(VllmConfig, JambaAlign) {
  const KvCacheConfig c =
      MakeKvCacheConfig(Load("ai21labs--Jamba-v0.1"), Gib(8, MambaCacheMode::kAlign)).value();
  EXPECT_EQ(c.cache_block_size, 80);  // Mamba-1 state 311,296 bytes / 4096 per token -> 80
  // Mamba-1 has no chunk: `all` falls back to 2048-token blocks.
  const KvCacheConfig all = MakeKvCacheConfig(Load("ai21labs--Jamba-v0.1"), Gib(8)).value();
  EXPECT_EQ(all.cache_block_size, 2048);
}

TEST(VllmConfig, GemmaThreeCutsTheWindowLayersIntoGroupsOfTheFullOnes) {
  // 29 window layers and 5 full ones: groups of 5 (29 is not under 1.5 x 5), 6 window groups,
  // the last padded, then the full group, in first-seen order.
  const KvCacheConfig c = MakeKvCacheConfig(Load("google--gemma-3-4b-it"), Gib(8)).value();
  ASSERT_EQ(c.groups.size(), 7u);
  for (int g = 0; g < 6; ++g)
    EXPECT_EQ(c.groups[g].spec.type, SpecType::kSlidingWindow);
  EXPECT_EQ(c.groups[6].spec.type, SpecType::kFullAttention);
  EXPECT_EQ(c.groups[0].spec.sliding_window, 1024);
  EXPECT_EQ(c.group_size, 5);
  // A window group takes every sixth window layer: 0, 7, 14, ... of the window bucket.
  EXPECT_EQ(c.groups[0].layers.size(), 5u);
  EXPECT_EQ(c.groups[5].layers.size(), 4u);
}

TEST(VllmConfig, GemmaTwoAtFourGibIsRefusedAsVllmRefusesIt) {
  // 21 full layers x 1024 blocks + 21 window layers x (ceil((4095 + 8192) / 16) + 1) blocks
  // of 16 x 8 x 512 x 2 bytes: 4.6 GiB for one 16384-token request.
  const Result<KvCacheConfig> c = MakeKvCacheConfig(Load("google--gemma-2-9b"), Gib(4));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("vLLM refuses"), std::string::npos);
  EXPECT_TRUE(MakeKvCacheConfig(Load("google--gemma-2-9b"), Gib(5)).ok());
}

LayerSpec Layer(int32_t i, LayerKind kind, int32_t kv_heads, int32_t head_dim) {
  LayerSpec l;
  l.layer = i;
  l.kind = kind;
  l.num_q_heads = 2 * kv_heads;
  l.num_kv_heads = kv_heads;
  l.head_dim_k = l.head_dim_v = head_dim;
  l.window = kind == LayerKind::kSlidingWindow ? 4096 : 0;
  l.chunk = kind == LayerKind::kChunkedLocal ? 8192 : 0;
  return l;
}

TEST(VllmConfig, OneTypeWithDifferentPagesIsOneGroupOverEveryPage) {
  // Every layer a 4096-token window, half with 8 KV heads and half with 4: vLLM's
  // UniformTypeKVCacheSpecs - one group, a block spans every layer's page.
  ModelSpec m;
  m.num_layers = 4;
  for (int32_t i = 0; i < 4; ++i)
    m.layers.push_back(Layer(i, LayerKind::kSlidingWindow, i % 2 == 0 ? 8 : 4, 128));
  const KvCacheConfig c = MakeKvCacheConfig(m, Gib(1)).value();
  ASSERT_EQ(c.groups.size(), 1u);
  EXPECT_EQ(c.groups[0].layers.size(), 4u);
  // Pages of 16 tokens: 2 x 65,536 + 2 x 32,768 bytes per block.
  EXPECT_EQ(c.num_blocks, kGiB / (2 * 65536 + 2 * 32768));
}

TEST(VllmConfig, ChunkedLocalPagesAndMixedBlockSizes) {
  // A chunked layer's page is K and V of head_size each (vLLM's plain AttentionSpec).
  ModelSpec m;
  m.num_layers = 2;
  m.layers = {Layer(0, LayerKind::kChunkedLocal, 8, 128),
              Layer(1, LayerKind::kFullAttention, 8, 128)};
  m.layers[0].head_dim_v = 64;  // ignored by vLLM for chunked layers
  const KvCacheConfig c = MakeKvCacheConfig(m, Gib(1)).value();
  ASSERT_EQ(c.groups.size(), 2u);
  EXPECT_EQ(c.groups[0].spec.page_size_bytes(), 2 * 16 * 8 * 128 * 2);
  // Beside a full layer with half its page, the full block doubles to 32 tokens and hits align
  // to 32 while chunked blocks stay at 16: vLLM asserts on that, so it is refused.
  m.layers[1] = Layer(1, LayerKind::kFullAttention, 4, 128);  // half the chunked page
  const Result<KvCacheConfig> mixed = MakeKvCacheConfig(m, Gib(1));
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(mixed.status().message().find("chunked local attention with 16-token blocks"),
            std::string::npos)
      << mixed.status().message();
}

TEST(VllmConfig, RefusesARecurrentPageSmallerThanTheLargestPage) {
  // Bamba with its last attention layer given twice the KV heads: the state page is padded to
  // the first attention layer's page, half the largest, and a recurrent block cannot grow.
  ModelSpec m = Load("ibm-ai-platform--Bamba-9B");
  LayerSpec* last = nullptr;
  for (LayerSpec& l : m.layers) {
    if (l.owns_kv()) last = &l;
  }
  ASSERT_NE(last, nullptr);
  last->num_kv_heads *= 2;
  const Result<KvCacheConfig> c = MakeKvCacheConfig(m, Gib(8));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(c.status().message().find("layer 0 is recurrent and its page"), std::string::npos)
      << c.status().message();
}

TEST(VllmConfig, RefusesWhatVllmDoesNotPrefixCache) {
  const Result<KvCacheConfig> mllama =
      MakeKvCacheConfig(Load("meta-llama--Llama-3.2-11B-Vision"), Gib(16));
  ASSERT_FALSE(mllama.ok());
  EXPECT_EQ(mllama.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(mllama.status().message().find("cross attention"), std::string::npos);
}

TEST(VllmConfig, AMemoryWhoseBlocksWouldNotFitInThisMachineIsRefused) {
  KvCacheOptions o = Gib(100.0 * 1024);  // 100 TiB: 52 M blocks of Llama pages
  const Result<KvCacheConfig> c = MakeKvCacheConfig(Load("meta-llama--Llama-3.1-8B"), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("more than the 16777216 one pool may have"),
            std::string::npos)
      << c.status().message();
  EXPECT_TRUE(MakeKvCacheConfig(Load("meta-llama--Llama-3.1-8B"), Gib(1024)).ok());  // 1 TiB
}

TEST(VllmConfig, BadOptionsNameTheOption) {
  KvCacheOptions o = Gib(8);
  o.block_size = 0;
  const Result<KvCacheConfig> c = MakeKvCacheConfig(Load("meta-llama--Llama-3.1-8B"), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("block size 0"), std::string::npos);
  EXPECT_FALSE(ParseMambaCacheMode("sometimes").ok());
  EXPECT_EQ(ParseMambaCacheMode("align").value(), MambaCacheMode::kAlign);
}

}  // namespace
}  // namespace hkv::vllm
