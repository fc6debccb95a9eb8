// The end-to-end proof over scaled real models: randomised workloads with prefix sharing,
// multi-turn continuations, forks, speculative decoding and memory pressure give exactly the
// dense reference's tokens and logits, and every feature really ran.
#include <cctype>
#include <string>

#include <gtest/gtest.h>

#include <hkv/engine/verify.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

class Verify : public ::testing::TestWithParam<std::string> {};

TEST_P(Verify, RandomWorkloadsMatchDenseAndExerciseEveryFeature) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + GetParam(), load);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  bool windows = false, state = false;
  for (const LayerSpec& l : real->layers) {
    if (l.layer >= TinyModelOptions{}.max_layers) continue;
    windows = windows || l.kind == LayerKind::kSlidingWindow || l.kind == LayerKind::kChunkedLocal;
    state = state || IsRecurrentKind(l.kind);
  }
  for (uint64_t seed : {1u, 2u}) {
    VerifyOptions o;
    o.seed = seed;
    auto r = RunVerify(*real, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const EngineCounters& f = r->features;
    const std::string what =
        "seed " + std::to_string(seed) + ": steps " + std::to_string(r->steps) + ", hits " +
        std::to_string(f.prefix_hit_tokens) + ", preemptions " + std::to_string(f.preemptions) +
        ", forks " + std::to_string(f.forks) + ", truncations " + std::to_string(f.truncations) +
        ", window frees " + std::to_string(f.window_blocks_freed) + ", checkpoint hits " +
        std::to_string(f.checkpoint_hits);
    EXPECT_TRUE(r->completed) << what;
    EXPECT_EQ(r->mismatches, 0) << what;
    EXPECT_LE(r->max_logit_diff, 1e-4f) << what;
    EXPECT_GE(r->requests, o.requests) << what;
    EXPECT_GT(f.prefix_hit_tokens, 0) << what;
    EXPECT_GT(f.preemptions, 0) << what;
    EXPECT_GT(f.forks, 0) << what;
    EXPECT_GT(f.truncations, 0) << what;
    EXPECT_GT(f.drafts_accepted, 0) << what;
    if (windows) {
      EXPECT_GT(f.window_blocks_freed, 0) << what;
    }
    if (state) {
      EXPECT_GT(f.checkpoint_hits, 0) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Verify,
                         ::testing::Values("meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                                           "google--gemma-3-4b-it",
                                           "mistralai--Ministral-8B-Instruct-2410",
                                           "meta-llama--Llama-4-Scout-17B-16E-Instruct",
                                           "openai--gpt-oss-20b", "ai21labs--Jamba-v0.1",
                                           "ibm-ai-platform--Bamba-9B",
                                           "Qwen--Qwen3-Next-80B-A3B-Instruct"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param.substr(p.param.find("--") + 2);
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace hkv
