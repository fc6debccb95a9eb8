// Every bundled real config loads, with layer kinds and byte figures worked out by hand from the
// config numbers (bf16 K/V, bf16 conv and ssm state unless a test says otherwise).
#include <gtest/gtest.h>

#include "spec_test_util.h"

namespace hkv {
namespace {

using testing::CountKind;
using testing::CountOwners;
using testing::MustLoad;

std::vector<int32_t> LayersOfKind(const ModelSpec& m, LayerKind kind) {
  std::vector<int32_t> out;
  for (const LayerSpec& l : m.layers) {
    if (l.kind == kind) out.push_back(l.layer);
  }
  return out;
}

const LayerSpec& First(const ModelSpec& m, LayerKind kind) {
  for (const LayerSpec& l : m.layers) {
    if (l.kind == kind) return l;
  }
  ADD_FAILURE() << "no layer of kind " << LayerKindName(kind);
  return m.layers.front();
}

TEST(ModelFiguresTest, Llama31_8B) {
  const ModelSpec m = MustLoad("meta-llama--Llama-3.1-8B");
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 32);
  // 2 (K,V) * 8 kv heads * 128 * 2 bytes.
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 4096);
  EXPECT_EQ(m.bytes_per_token_full(), 32 * 4096);
  EXPECT_EQ(m.state_bytes_per_sequence(), 0);
  EXPECT_EQ(m.max_position_embeddings, 131072);
}

TEST(ModelFiguresTest, Gemma2_9B) {
  const ModelSpec m = MustLoad("google--gemma-2-9b");
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 21);
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 21);
  EXPECT_EQ(m.layers[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(m.layers[1].kind, LayerKind::kFullAttention);
  EXPECT_EQ(m.layers[0].window, 4096);
  // 2 * 8 * 256 * 2.
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 8192);
  EXPECT_EQ(m.bytes_per_token_full(), 21 * 8192);
  EXPECT_EQ(m.max_position_embeddings, 8192);
}

TEST(ModelFiguresTest, Gemma3_4B) {
  const ModelSpec m = MustLoad("google--gemma-3-4b-it");
  EXPECT_EQ(LayersOfKind(m, LayerKind::kFullAttention), (std::vector<int32_t>{5, 11, 17, 23, 29}));
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 29);
  EXPECT_EQ(First(m, LayerKind::kSlidingWindow).window, 1024);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 2 * 4 * 256 * 2);
  EXPECT_EQ(m.bytes_per_token_full(), 5 * 4096);
}

TEST(ModelFiguresTest, Gemma3n_E4B_SharesTheLastFifteenLayers) {
  const ModelSpec m = MustLoad("google--gemma-3n-E4B-it");
  EXPECT_EQ(m.num_layers, 35);
  EXPECT_EQ(CountOwners(m, LayerKind::kFullAttention), 4);
  EXPECT_EQ(CountOwners(m, LayerKind::kSlidingWindow), 16);
  for (const LayerSpec& l : m.layers) {
    if (l.layer < 20) {
      EXPECT_EQ(l.kv_source_layer, -1) << l.layer;
    } else {
      // Shared layers read the last non-shared layer of their type: 18 (sliding), 19 (full).
      EXPECT_EQ(l.kv_source_layer, l.kind == LayerKind::kFullAttention ? 19 : 18) << l.layer;
      EXPECT_EQ(l.kv_bytes_per_token(), 0);
    }
  }
  EXPECT_EQ(m.bytes_per_token_full(), 4 * 2 * 2 * 256 * 2);
}

TEST(ModelFiguresTest, Ministral_8B) {
  const ModelSpec m = MustLoad("mistralai--Ministral-8B-Instruct-2410");
  EXPECT_EQ(LayersOfKind(m, LayerKind::kFullAttention),
            (std::vector<int32_t>{0, 4, 8, 12, 16, 20, 24, 28, 32}));
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 27);
  EXPECT_EQ(First(m, LayerKind::kSlidingWindow).window, 32768);
  EXPECT_EQ(m.bytes_per_token_full(), 9 * 4096);
  EXPECT_EQ(m.max_position_embeddings, 32768);
}

TEST(ModelFiguresTest, Llama32_11B_Vision) {
  const ModelSpec m = MustLoad("meta-llama--Llama-3.2-11B-Vision");
  EXPECT_EQ(LayersOfKind(m, LayerKind::kCrossAttention),
            (std::vector<int32_t>{3, 8, 13, 18, 23, 28, 33, 38}));
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 32);
  // head_dim absent: 4096 / 32 = 128.
  EXPECT_EQ(m.layers[0].head_dim_k, 128);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 4096);
  // 4 tiles * ((560 / 14)^2 + 1).
  EXPECT_EQ(m.max_encoder_tokens, 6404);
  EXPECT_FALSE(First(m, LayerKind::kCrossAttention).rope);
}

TEST(ModelFiguresTest, Jamba_v01) {
  const ModelSpec m = MustLoad("ai21labs--Jamba-v0.1");
  EXPECT_EQ(LayersOfKind(m, LayerKind::kFullAttention), (std::vector<int32_t>{4, 12, 20, 28}));
  EXPECT_EQ(CountKind(m, LayerKind::kMamba1), 28);
  const LayerSpec& mamba = First(m, LayerKind::kMamba1);
  // d_inner = 2 * 4096; conv (d_conv - 1, d_inner), ssm (d_inner, d_state = 16).
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 8192}));
  EXPECT_EQ(mamba.state[1].shape, (std::vector<int64_t>{8192, 16}));
  EXPECT_EQ(mamba.state_bytes(), 311296);
  EXPECT_EQ(m.state_bytes_per_sequence(), 28 * 311296);
  LoadOptions fp32_ssm;
  fp32_ssm.state_dtype = DType::kFP32;
  EXPECT_EQ(First(MustLoad("ai21labs--Jamba-v0.1", fp32_ssm), LayerKind::kMamba1).state_bytes(),
            573440);
}

TEST(ModelFiguresTest, Bamba_9B) {
  const ModelSpec m = MustLoad("ibm-ai-platform--Bamba-9B");
  EXPECT_EQ(LayersOfKind(m, LayerKind::kFullAttention), (std::vector<int32_t>{9, 18, 27}));
  EXPECT_EQ(CountKind(m, LayerKind::kMamba2), 29);
  const LayerSpec& mamba = First(m, LayerKind::kMamba2);
  // conv (3, 8192 + 2 * 1 * 128), ssm (128 heads, 64, 128).
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 8448}));
  EXPECT_EQ(mamba.state[1].shape, (std::vector<int64_t>{128, 64, 128}));
  EXPECT_EQ(mamba.state_bytes(), 2147840);
  LoadOptions fp32_ssm;
  fp32_ssm.state_dtype = DType::kFP32;
  EXPECT_EQ(
      First(MustLoad("ibm-ai-platform--Bamba-9B", fp32_ssm), LayerKind::kMamba2).state_bytes(),
      4244992);
}

TEST(ModelFiguresTest, GptOss_20B) {
  const ModelSpec m = MustLoad("openai--gpt-oss-20b");
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 12);
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 12);
  EXPECT_EQ(m.layers[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(m.layers[0].window, 128);
  for (const LayerSpec& l : m.layers)
    EXPECT_TRUE(l.learned_sinks);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 2 * 8 * 64 * 2);
  EXPECT_EQ(m.bytes_per_token_full(), 12 * 2048);
}

TEST(ModelFiguresTest, Qwen3Next_80B) {
  const ModelSpec m = MustLoad("Qwen--Qwen3-Next-80B-A3B-Instruct");
  const std::vector<int32_t> full = LayersOfKind(m, LayerKind::kFullAttention);
  ASSERT_EQ(full.size(), 12u);
  EXPECT_EQ(full.front(), 3);
  EXPECT_EQ(full.back(), 47);
  EXPECT_EQ(CountKind(m, LayerKind::kGatedDeltaNet), 36);
  const LayerSpec& gdn = First(m, LayerKind::kGatedDeltaNet);
  // conv (3, 2*16*128 + 32*128), recurrent (32 value heads, 128, 128).
  EXPECT_EQ(gdn.state[0].shape, (std::vector<int64_t>{3, 8192}));
  EXPECT_EQ(gdn.state[1].shape, (std::vector<int64_t>{32, 128, 128}));
  EXPECT_EQ(gdn.state_bytes(), 1097728);
  EXPECT_EQ(m.layers[3].kv_bytes_per_token(), 2 * 2 * 256 * 2);
}

TEST(ModelFiguresTest, Llama4Scout) {
  const ModelSpec m = MustLoad("meta-llama--Llama-4-Scout-17B-16E-Instruct");
  EXPECT_EQ(CountKind(m, LayerKind::kChunkedLocal), 36);
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 12);
  EXPECT_EQ(m.layers[3].kind, LayerKind::kFullAttention);
  EXPECT_FALSE(m.layers[3].rope);
  EXPECT_EQ(m.layers[0].chunk, 8192);
  EXPECT_EQ(m.bytes_per_token_full(), 12 * 4096);
}

TEST(ModelFiguresTest, DeepSeekV2Lite_Mla) {
  const ModelSpec m = MustLoad("deepseek-ai--DeepSeek-V2-Lite");
  EXPECT_EQ(CountKind(m, LayerKind::kMla), 27);
  // One latent of 512 + 64 elements per token.
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 1152);
  EXPECT_EQ(m.bytes_per_token_full(), 27 * 1152);
}

}  // namespace
}  // namespace hkv
