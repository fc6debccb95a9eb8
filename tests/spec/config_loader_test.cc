// Family readers and the traps real configs contain, on small inline configs.
#include <gtest/gtest.h>

#include "spec_test_util.h"

namespace hkv {
namespace {

using testing::CountKind;
using testing::MustParse;

TEST(ConfigLoaderTest, Qwen2SlidingWindowIsIgnoredWhenDisabled) {
  const ModelSpec m = MustParse(R"({"model_type": "qwen2", "hidden_size": 3584,
      "num_hidden_layers": 4, "num_attention_heads": 28, "num_key_value_heads": 4,
      "sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 2})");
  EXPECT_EQ(CountKind(m, LayerKind::kFullAttention), 4);
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_NE(m.warnings[0].find("use_sliding_window is false"), std::string::npos);
  // head_dim absent: hidden / heads = 128.
  EXPECT_EQ(m.layers[0].head_dim_k, 128);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 2 * 4 * 128 * 2);
}

TEST(ConfigLoaderTest, Qwen2SlidesFromMaxWindowLayersWhenEnabled) {
  const ModelSpec m = MustParse(R"({"model_type": "qwen2", "hidden_size": 256,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "sliding_window": 1024, "use_sliding_window": true, "max_window_layers": 2})");
  EXPECT_EQ(m.layers[0].kind, LayerKind::kFullAttention);
  EXPECT_EQ(m.layers[1].kind, LayerKind::kFullAttention);
  EXPECT_EQ(m.layers[2].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(m.layers[3].window, 1024);
}

TEST(ConfigLoaderTest, MistralAppliesItsWindowToEveryLayerOrNone) {
  const ModelSpec sliding = MustParse(R"({"model_type": "mistral", "hidden_size": 4096,
      "num_hidden_layers": 3, "num_attention_heads": 32, "num_key_value_heads": 8,
      "sliding_window": 4096})");
  EXPECT_EQ(CountKind(sliding, LayerKind::kSlidingWindow), 3);
  const ModelSpec full = MustParse(R"({"model_type": "mistral", "hidden_size": 4096,
      "num_hidden_layers": 3, "num_attention_heads": 32, "num_key_value_heads": 8,
      "sliding_window": null})");
  EXPECT_EQ(CountKind(full, LayerKind::kFullAttention), 3);
}

TEST(ConfigLoaderTest, Gemma2AlternatesStartingWithSliding) {
  const ModelSpec m = MustParse(R"({"model_type": "gemma2", "hidden_size": 64,
      "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "sliding_window": 16})");
  const std::vector<std::string> kinds = m.LayerKindNames();
  EXPECT_EQ(kinds, (std::vector<std::string>{"sliding_window", "full_attention", "sliding_window",
                                             "full_attention", "sliding_window"}));
}

TEST(ConfigLoaderTest, NestedTextConfigIsTheLanguageModel) {
  const ModelSpec m = MustParse(R"({"model_type": "gemma3", "hidden_size": 9999,
      "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 7,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "sliding_window": 32, "sliding_window_pattern": 3}})");
  EXPECT_EQ(m.model_type, "gemma3");
  EXPECT_EQ(m.hidden_size, 64);
  // Layer i is global iff (i + 1) % 3 == 0.
  EXPECT_EQ(m.LayerKindNames()[2], "full_attention");
  EXPECT_EQ(m.LayerKindNames()[5], "full_attention");
  EXPECT_EQ(CountKind(m, LayerKind::kSlidingWindow), 5);
}

TEST(ConfigLoaderTest, Llama4ChunksOnlyRopeLayers) {
  const ModelSpec implicit = MustParse(R"({"model_type": "llama4", "text_config": {
      "model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 8,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "attention_chunk_size": 64}})");
  for (const LayerSpec& l : implicit.layers) {
    const bool nope = (l.layer + 1) % 4 == 0;
    EXPECT_EQ(l.kind, nope ? LayerKind::kFullAttention : LayerKind::kChunkedLocal) << l.layer;
    EXPECT_EQ(l.rope, !nope);
  }
  const ModelSpec explicit_list = MustParse(R"({"model_type": "llama4_text", "hidden_size": 64,
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "attention_chunk_size": 64, "no_rope_layers": [0, 1, 1]})");
  EXPECT_EQ(explicit_list.layers[0].kind, LayerKind::kFullAttention);
  EXPECT_EQ(explicit_list.layers[1].kind, LayerKind::kChunkedLocal);
  EXPECT_EQ(explicit_list.layers[1].chunk, 64);
}

TEST(ConfigLoaderTest, TorchDtypeDoesNotChooseTheCacheType) {
  const std::string json = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 2, "torch_dtype": "float32"})";
  const ModelSpec m = MustParse(json);
  EXPECT_EQ(m.layers[0].kv_dtype, DType::kBF16);
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 2 * 2 * 16 * 2);
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_NE(m.warnings[0].find("float32"), std::string::npos);
  LoadOptions fp8;
  fp8.kv_dtype = DType::kFP8;
  EXPECT_EQ(MustParse(json, fp8).layers[0].kv_bytes_per_token(), 2 * 2 * 16);
}

TEST(ConfigLoaderTest, ExplicitLayerTypesNeedNoKnownFamily) {
  const ModelSpec m = MustParse(R"({"model_type": "my_custom_hybrid", "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
      "sliding_window": 8, "attention_chunk_size": 32,
      "layer_types": ["sliding_attention", "chunked_attention", "full_attention", "mlp"]})");
  EXPECT_EQ(m.LayerKindNames(),
            (std::vector<std::string>{"sliding_window", "chunked_local", "full_attention", "mlp"}));
  EXPECT_EQ(m.layers[3].kv_bytes_per_token(), 0);
}

TEST(ConfigLoaderTest, StateDtypeOptionSizesTheSsmButNotTheConv) {
  const std::string json = R"({"model_type": "bamba", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
      "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2})";
  LoadOptions o;
  o.state_dtype = DType::kFP32;
  const ModelSpec m = MustParse(json, o);
  const LayerSpec& mamba = m.layers[0];
  ASSERT_EQ(mamba.kind, LayerKind::kMamba2);
  // conv (3, 128 + 2*1*8) in bf16, ssm (8, 16, 8) in fp32.
  ASSERT_EQ(mamba.state.size(), 2u);
  EXPECT_EQ(mamba.state[0].shape, (std::vector<int64_t>{3, 144}));
  EXPECT_EQ(mamba.state[1].shape, (std::vector<int64_t>{8, 16, 8}));
  EXPECT_EQ(mamba.state_bytes(), 3 * 144 * 2 + 8 * 16 * 8 * 4);
}

TEST(ConfigLoaderTest, SupportedTypesCoverTheRequiredFamilies) {
  const auto& types = SupportedModelTypes();
  for (std::string_view t :
       {"llama",      "mistral",          "ministral",  "qwen2",       "gemma2",
        "gemma3",     "gemma3_text",      "gemma3n",    "mllama",      "jamba",
        "bamba",      "granitemoehybrid", "nemotron_h", "falcon_h1",   "zamba2",
        "qwen3_next", "gpt_oss",          "llama4",     "deepseek_v2", "deepseek_v3"}) {
    EXPECT_NE(std::find(types.begin(), types.end(), t), types.end()) << t;
  }
}

}  // namespace
}  // namespace hkv
