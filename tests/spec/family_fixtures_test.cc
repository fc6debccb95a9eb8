// Families that have no real config among the bundled models: tests/data/configs holds configs
// with their real field names and published geometry (see docs/config-families.md), and inline
// configs pin the defaults transformers applies when a field is absent.
#include <gtest/gtest.h>

#include "spec_test_util.h"

namespace hkv {
namespace {

using testing::CountKind;
using testing::MustParse;

ModelSpec Fixture(const std::string& name) {
  Result<ModelSpec> r = LoadModelConfig(std::string(HKV_TEST_DATA_DIR) + "/configs/" + name);
  if (!r.ok()) ADD_FAILURE() << r.status().ToString();
  return r.ok() ? *r : ModelSpec{};
}

const LayerSpec& First(const ModelSpec& m, LayerKind kind) {
  for (const LayerSpec& l : m.layers) {
    if (l.kind == kind) return l;
  }
  ADD_FAILURE() << "no layer of kind " << LayerKindName(kind);
  return m.layers.front();
}

TEST(FamilyFixturesTest, Qwen25_7B_IsAllFullAttention) {
  const ModelSpec m = Fixture("qwen2.json");
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 28);
  EXPECT_EQ(m.bytes_per_token_full(), 28 * 2 * 4 * 128 * 2);
}

TEST(FamilyFixturesTest, Qwen2WithSlidingEnabledSlidesFromMaxWindowLayers) {
  const ModelSpec m = Fixture("qwen2-sliding.json");
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 21);
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 7);
  EXPECT_EQ(m.layers[21].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(m.layers[21].window, 4096);
}

TEST(FamilyFixturesTest, Mistral7B_DerivesHeadDim) {
  const ModelSpec m = Fixture("mistral.json");
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 32);
  EXPECT_EQ(m.layers[0].head_dim_k, 128);
  EXPECT_EQ(m.layers[0].window, 4096);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 4096);
}

TEST(FamilyFixturesTest, DeepSeekV3_Mla) {
  const ModelSpec m = Fixture("deepseek_v3.json");
  EXPECT_EQ(CountKind(m, LayerKind::kMla), 61);
  EXPECT_EQ(m.bytes_per_token_full(), 61 * 1152);
}

TEST(FamilyFixturesTest, GraniteHybrid) {
  const ModelSpec m = Fixture("granitemoehybrid.json");
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 4);
  EXPECT_EQ(CountKind(m, LayerKind::kMamba2), 36);
  EXPECT_EQ(First(m, LayerKind::kMamba2).state_bytes(), 2147840);
}

TEST(FamilyFixturesTest, NemotronH_PatternWithMlpLayers) {
  const ModelSpec m = Fixture("nemotron_h.json");
  EXPECT_EQ(m.num_layers, 52);
  std::vector<int32_t> attention;
  for (const LayerSpec& l : m.layers) {
    if (l.kind == LayerKind::kFullAttention) attention.push_back(l.layer);
  }
  EXPECT_EQ(attention, (std::vector<int32_t>{7, 18, 29, 40}));
  EXPECT_EQ(CountKind(m, LayerKind::kMamba2), 24);
  EXPECT_EQ(CountKind(m, LayerKind::kMlp), 24);
  const LayerSpec& mamba = First(m, LayerKind::kMamba2);
  // conv (3, 128*64 + 2*8*128), ssm (128, 64, 128).
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 10240}));
  EXPECT_EQ(mamba.state_bytes(), 2158592);
}

TEST(FamilyFixturesTest, FalconH1_EveryLayerIsAttentionPlusMamba2) {
  const ModelSpec m = Fixture("falcon_h1.json");
  EXPECT_EQ(m.layers.size(), 48u);
  for (const std::string& kinds : m.LayerKindNames())
    EXPECT_EQ(kinds, "full_attention+mamba2");
  const LayerSpec& mamba = First(m, LayerKind::kMamba2);
  // d_ssm 3072 = 48 heads x 64; conv (3, 3072 + 2*256), ssm (48, 64, 256).
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 3584}));
  EXPECT_EQ(mamba.state[1].shape, (std::vector<int64_t>{48, 64, 256}));
  EXPECT_EQ(m.state_bytes_per_sequence(), 24 * 1594368);
  EXPECT_EQ(m.bytes_per_token_full(), 24 * 2 * 2 * 128 * 2);
}

TEST(FamilyFixturesTest, Zamba2_HybridLayersAddTheirOwnKv) {
  const ModelSpec m = Fixture("zamba2.json");
  EXPECT_EQ(CountKind(m, LayerKind::kMamba2), 81);
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 13);
  const LayerSpec& attn = First(m, LayerKind::kFullAttention);
  EXPECT_EQ(attn.layer, 6);
  // Attention on 2 * hidden = 7168 with 32 heads: head width 224, MHA.
  EXPECT_EQ(attn.head_dim_k, 224);
  EXPECT_EQ(attn.kv_bytes_per_token(), 28672);
  const LayerSpec& mamba = First(m, LayerKind::kMamba2);
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 7424}));
  EXPECT_EQ(mamba.state[1].shape, (std::vector<int64_t>{112, 64, 64}));
}

TEST(FamilyFixturesTest, GenericLayerTypesConfig) {
  const ModelSpec m = Fixture("my_custom_hybrid.json");
  EXPECT_EQ(m.model_type, "my_custom_hybrid");
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 2);
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 6);
}

TEST(FamilyDefaultsTest, MistralAbsentWindowAndKvHeadsTakeTheClassDefaults) {
  const ModelSpec m = MustParse(R"({"model_type": "mistral", "hidden_size": 4096,
      "num_hidden_layers": 1, "num_attention_heads": 32})");
  EXPECT_EQ(m.layers[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(m.layers[0].window, 4096);
  EXPECT_EQ(m.layers[0].num_kv_heads, 8);
  const ModelSpec null_kv = MustParse(R"({"model_type": "mistral", "hidden_size": 4096,
      "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": null,
      "sliding_window": null})");
  EXPECT_EQ(null_kv.layers[0].kind, LayerKind::kFullAttention);
  EXPECT_EQ(null_kv.layers[0].num_kv_heads, 32);
}

TEST(FamilyDefaultsTest, NemotronLayerCountComesFromThePattern) {
  const ModelSpec m = MustParse(R"({"model_type": "nemotron_h", "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "hybrid_override_pattern": "M-*E", "mamba_num_heads": 8, "mamba_head_dim": 8,
      "n_groups": 2, "ssm_state_size": 4, "conv_kernel": 4})");
  EXPECT_EQ(m.num_layers, 4);
  // Inner width is heads x head width (64), not expand x hidden.
  EXPECT_EQ(m.layers[0].state[0].shape, (std::vector<int64_t>{3, 64 + 2 * 2 * 4}));
}

TEST(FamilyDefaultsTest, GraniteWithoutLayerTypesIsAllMambaWithBambaDefaults) {
  const ModelSpec m = MustParse(R"({"model_type": "granitemoehybrid", "hidden_size": 4096,
      "num_hidden_layers": 2, "num_attention_heads": 32})");
  EXPECT_EQ(CountKind(m, LayerKind::kMamba2), 2);
  // 128 heads, head width 8192/128 = 64, 1 group, d_state 256, conv 4.
  EXPECT_EQ(m.layers[0].state[0].shape, (std::vector<int64_t>{3, 8192 + 2 * 256}));
  EXPECT_EQ(m.layers[0].state[1].shape, (std::vector<int64_t>{128, 64, 256}));
}

TEST(FamilyDefaultsTest, FalconAbsentDssmIs1024ButNullMeansExpandTimesHidden) {
  const std::string base = R"("model_type": "falcon_h1", "hidden_size": 256,
      "num_hidden_layers": 1, "num_attention_heads": 4, "mamba_n_heads": 16,
      "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 8)";
  const ModelSpec absent = MustParse("{" + base + "}");
  EXPECT_EQ(First(absent, LayerKind::kMamba2).recurrent.d_inner, 1024);
  EXPECT_EQ(First(absent, LayerKind::kMamba2).recurrent.head_dim, 64);
  const ModelSpec null_dssm = MustParse("{" + base + R"(, "mamba_d_ssm": null})");
  EXPECT_EQ(First(null_dssm, LayerKind::kMamba2).recurrent.d_inner, 512);
}

TEST(FamilyDefaultsTest, Llama4EmptyNoRopeListFallsBackToEveryFourthLayer) {
  const ModelSpec m = MustParse(R"({"model_type": "llama4_text", "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "no_rope_layers": []})");
  EXPECT_EQ(CountKind(m, LayerKind::kChunkedLocal), 3);
  EXPECT_EQ(m.layers[0].chunk, 8192);
  EXPECT_EQ(m.layers[3].kind, LayerKind::kFullAttention);
}

}  // namespace
}  // namespace hkv
