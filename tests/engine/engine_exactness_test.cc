// Generation through the managed, paged cache equals the dense no-cache reference: same greedy
// tokens, logits within 1e-4, for scaled-down real attention models, under chunked prefill and
// prefix hits.
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "engine_test_util.h"
#include "paged_harness.h"

namespace hkv {
namespace {

using testing::ExpectMatchesDense;
using testing::Generate;
using testing::Generation;
using testing::Harness;
using testing::Make;
using testing::Prompt;

class EngineExactness : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineExactness, ChunkedPrefillAndPrefixHitsMatchDense) {
  Harness s = Make(GetParam());
  ASSERT_TRUE(s.manager.has_value());
  const std::vector<int32_t> a = Prompt(37, 1);
  const Generation ga = Generate(s, 1, a, 8, 20);
  ExpectMatchesDense(s, ga, a.size());
  // A second request sharing the first 30 tokens hits a prefix, and computes only the rest.
  std::vector<int32_t> b(a.begin(), a.begin() + 30);
  for (int32_t t : Prompt(9, 2))
    b.push_back(t);
  const Generation gb = Generate(s, 2, b, 5, 15);
  EXPECT_GT(gb.hit, 0);
  EXPECT_EQ(gb.logits.begin()->first, gb.hit);
  ExpectMatchesDense(s, gb, b.size());
  // After both are freed, the first one's whole conversation comes back as a hit.
  ASSERT_TRUE(s.manager->Free(1).ok());
  ASSERT_TRUE(s.manager->Free(2).ok());
  const Generation gc = Generate(s, 3, ga.tokens, 6, 8);
  EXPECT_GE(gc.hit, 40);
  ExpectMatchesDense(s, gc, ga.tokens.size());
  ASSERT_TRUE(s.manager->Free(3).ok());
  EXPECT_TRUE(s.manager->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Models, EngineExactness, testing::kEngineModels, testing::ModelTestName);

TEST(TinyModel, KeepsMlaCrossAttentionAndKvSharedLayers) {
  const ModelSpec mla = testing::LoadScaled("deepseek-ai--DeepSeek-V2-Lite");
  ASSERT_FALSE(mla.layers.empty());
  EXPECT_EQ(mla.layers[0].kind, LayerKind::kMla);
  EXPECT_EQ(mla.layers[0].head_dim_k, mla.layers[0].kv_lora_rank + mla.layers[0].qk_rope_head_dim);
  const ModelSpec vision = testing::LoadScaled("meta-llama--Llama-3.2-11B-Vision");
  EXPECT_TRUE(std::any_of(vision.layers.begin(), vision.layers.end(),
                          [](const LayerSpec& l) { return l.kind == LayerKind::kCrossAttention; }));
  EXPECT_EQ(vision.max_encoder_tokens, TinyModelOptions{}.encoder_tokens);
  // Gemma-3n's KV-shared layers start at layer 20: the scaled model keeps one anyway.
  const ModelSpec gemma3n = testing::LoadScaled("google--gemma-3n-E4B-it");
  EXPECT_TRUE(std::any_of(gemma3n.layers.begin(), gemma3n.layers.end(),
                          [](const LayerSpec& l) { return l.kv_source_layer >= 0; }));
}

TEST(TinyModel, KeepsThePatternAndScalesSpans) {
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto gemma = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/google--gemma-2-9b", load);
  ASSERT_TRUE(gemma.ok());
  TinyModelOptions o;
  o.max_layers = 4;
  o.window = 10;
  auto tiny = ScaleModel(*gemma, o);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  ASSERT_EQ(tiny->num_layers, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(tiny->layers[static_cast<size_t>(i)].kind,
              gemma->layers[static_cast<size_t>(i)].kind);
  }
  EXPECT_EQ(tiny->layers[0].window, 10);
  EXPECT_EQ(tiny->layers[0].kv_dtype, DType::kFP32);
  EXPECT_EQ(tiny->hidden_size, 64);
}

}  // namespace
}  // namespace hkv
