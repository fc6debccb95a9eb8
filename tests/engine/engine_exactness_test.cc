// Generation through the managed, paged cache equals the dense no-cache reference: same greedy
// tokens, logits within 1e-4, for scaled-down real attention models, under chunked prefill and
// prefix hits.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include <hkv/engine/engine.h>
#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/transformer.h>
#include <hkv/engine/verify.h>
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

// A batched engine (EngineOptions::batched): two requests sharing a 24-token prefix are admitted
// in one step, and the second is looked up after the first's step was allocated, before it ran.
// With ManagerConfig::publish_at_allocate that step's blocks are already published, so the second
// hits them - blocks computed in the same batch - where publishing at Commit leaves it nothing to
// hit. Recurrent models publish at Commit regardless (a hit needs a state). Every logit equals
// dense, with freed blocks poisoned.
class BatchedSteps : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchedSteps, ARequestHitsBlocksAnEarlierOneComputesInTheSameBatch) {
  const ModelSpec spec = testing::LoadScaled(GetParam());
  const ModelWeights weights = ModelWeights::Random(spec, 97, 1);
  PlanOptions po;
  po.memory_bytes = int64_t{4} << 20;
  po.block_tokens = 4;
  po.max_model_len = 256;
  const Plan plan = MakePlan(spec, po).value();
  const bool recurrent = std::any_of(plan.groups.begin(), plan.groups.end(),
                                     [](const KvGroup& g) { return g.is_state(); });
  std::vector<int32_t> a = Prompt(24, 1), b = a;
  for (int32_t t : Prompt(5, 2))
    a.push_back(t);
  for (int32_t t : Prompt(7, 3))
    b.push_back(t);
  for (bool publish : {false, true}) {
    ManagerConfig config = ManagerConfig::FromPlan(plan).value();
    config.publish_at_allocate = publish;
    EngineOptions eo;
    eo.batched = true;
    eo.chunk = 16;
    eo.poison_free_blocks = true;
    auto engine = Engine::Create(spec, weights, plan, config, eo);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    for (RequestId id : {1, 2}) {
      GenerationRequest r;
      r.id = id;
      r.prompt = id == 1 ? a : b;
      r.max_new_tokens = 5;
      ASSERT_TRUE((*engine)->Submit(r).ok());
    }
    ASSERT_TRUE((*engine)->Step().ok());
    // The first step computes 16 tokens of each: the second's hit is the first's 16.
    EXPECT_EQ((*engine)->counters().prefix_hit_tokens, publish && !recurrent ? 16 : 0)
        << (publish ? "publishing at Allocate" : "publishing at Commit");
    for (int i = 0; i < 200 && !(*engine)->idle(); ++i)
      ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_EQ((*engine)->finished().size(), 2u);
    for (const Sequence& seq : (*engine)->finished()) {
      const DenseCheck c = CheckAgainstDense(spec, weights, seq);
      EXPECT_EQ(c.mismatches, 0) << "request " << seq.id << " max diff " << c.max_logit_diff;
    }
    EXPECT_TRUE((*engine)->manager().CheckInvariants().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchedSteps,
                         ::testing::Values("meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                                           "meta-llama--Llama-4-Scout-17B-16E-Instruct",
                                           "deepseek-ai--DeepSeek-V2-Lite",
                                           "google--gemma-3n-E4B-it", "ibm-ai-platform--Bamba-9B"),
                         testing::ModelTestName);

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

// Each option below its minimum is refused with that option's name and value.
TEST(TinyModel, RefusesEachBadOptionByName) {
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto llama = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B", load);
  ASSERT_TRUE(llama.ok());
  const auto refused = [&](void (*edit)(TinyModelOptions&), const std::string& what) {
    TinyModelOptions o;
    edit(o);
    const Status s = ScaleModel(*llama, o).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find("tiny model: " + what), std::string::npos) << s.message();
  };
  refused([](TinyModelOptions& o) { o.max_layers = 0; }, "max_layers = 0: expected >= 1");
  refused([](TinyModelOptions& o) { o.hidden = 4; }, "hidden = 4: expected >= 8");
  refused([](TinyModelOptions& o) { o.kv_heads = 0; }, "kv_heads = 0: expected >= 1");
  refused([](TinyModelOptions& o) { o.q_per_kv = 0; }, "q_per_kv = 0: expected >= 1");
  refused([](TinyModelOptions& o) { o.head_dim = 2; }, "head_dim = 2: expected >= 4");
  refused([](TinyModelOptions& o) { o.head_dim = 18; }, "head_dim = 18: expected a multiple of 4");
  refused([](TinyModelOptions& o) { o.window = 0; }, "window = 0: expected >= 1");
  refused([](TinyModelOptions& o) { o.chunk = -1; }, "chunk = -1: expected >= 1");
  refused([](TinyModelOptions& o) { o.vocab = 1; }, "vocab = 1: expected >= 2");
  refused([](TinyModelOptions& o) { o.encoder_tokens = 0; }, "encoder_tokens = 0: expected >= 1");
}

TEST(RunVerify, RefusesEachBadOptionByName) {
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto llama = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B", load);
  ASSERT_TRUE(llama.ok());
  VerifyOptions o;
  o.requests = 0;
  Status s = RunVerify(*llama, o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("verify: requests = 0: expected >= 1"), std::string::npos)
      << s.message();
  o = {};
  o.max_steps = 0;
  s = RunVerify(*llama, o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("verify: max_steps = 0: expected >= 1"), std::string::npos)
      << s.message();
}

// An engine over scaled Llama: refusals name the one option or request field that failed, and
// leave the engine as it was.
class EngineRefusals : public ::testing::Test {
 protected:
  EngineRefusals()
      : spec_(testing::LoadScaled("meta-llama--Llama-3.1-8B")),
        weights_(ModelWeights::Random(spec_, 97, 1)),
        plan_(MakePlan(spec_, SmallPlan()).value()),
        config_(ManagerConfig::FromPlan(plan_).value()) {}
  static PlanOptions SmallPlan() {
    PlanOptions po;
    po.memory_bytes = int64_t{1} << 20;
    po.block_tokens = 4;
    po.max_model_len = 128;
    return po;
  }
  void ExpectRefused(const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  }
  ModelSpec spec_;
  ModelWeights weights_;
  Plan plan_;
  ManagerConfig config_;
};

// Engine is a handle on state kept out of its public header: moved (constructed or assigned)
// mid-run, it carries on where it stopped, and what it generates still matches dense.
using EngineHandle = EngineRefusals;
TEST_F(EngineHandle, AMovedEngineCarriesOn) {
  auto first = Engine::Create(spec_, weights_, plan_, config_, {}).value();
  GenerationRequest r;
  r.id = 1;
  r.prompt = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2};
  r.max_new_tokens = 6;
  ASSERT_TRUE(first->Submit(r).ok());
  ASSERT_TRUE(first->Step().ok());
  Engine moved(std::move(*first));
  ASSERT_FALSE(moved.idle());
  r.id = 2;
  ASSERT_TRUE(moved.Submit(r).ok());
  ASSERT_TRUE(moved.Step().ok());
  auto assigned = Engine::Create(spec_, weights_, plan_, config_, {}).value();
  *assigned = std::move(moved);
  for (int i = 0; i < 100 && !assigned->idle(); ++i)
    ASSERT_TRUE(assigned->Step().ok());
  ASSERT_EQ(assigned->finished().size(), 2u);
  for (const Sequence& seq : assigned->finished()) {
    const DenseCheck c = CheckAgainstDense(spec_, weights_, seq);
    EXPECT_EQ(c.mismatches, 0) << "request " << seq.id;
  }
  EXPECT_GT(assigned->counters().prefix_hit_tokens, 0);
  EXPECT_TRUE(assigned->manager().CheckInvariants().ok());
}

TEST_F(EngineRefusals, EachBadOptionIsNamed) {
  const auto refused = [&](void (*edit)(EngineOptions&), const std::string& what) {
    EngineOptions o;
    edit(o);
    ExpectRefused(Engine::Create(spec_, weights_, plan_, config_, o).status(), what);
  };
  refused([](EngineOptions& o) { o.token_budget = 0; }, "engine: token budget 0: expected >= 1");
  refused([](EngineOptions& o) { o.chunk = 0; }, "engine: chunk 0: expected >= 1");
  refused([](EngineOptions& o) { o.draft_tokens = -1; }, "engine: draft tokens -1: expected >= 0");
  refused([](EngineOptions& o) { o.lookahead = -1; }, "engine: lookahead -1: expected >= 0");
}

// The cache is laid out from the plan and indexed by the config's block ids: a config for other
// memory is refused by name instead of reading outside the buffers.
TEST_F(EngineRefusals, AConfigThatDoesNotDescribeThePlanIsRefused) {
  ManagerConfig bigger = config_;
  bigger.pool_blocks[0] += 1;
  ExpectRefused(Engine::Create(spec_, weights_, plan_, bigger, {}).status(),
                "manager config: pool 0 has");
  ManagerConfig coarser = config_;
  coarser.groups[0].block_tokens *= 2;
  ExpectRefused(Engine::Create(spec_, weights_, plan_, coarser, {}).status(),
                "manager config: group 0 has 8-token blocks; the plan's has 4");
}

TEST_F(EngineRefusals, EachBadRequestFieldIsNamed) {
  auto engine = Engine::Create(spec_, weights_, plan_, config_, {}).value();
  GenerationRequest r;
  r.id = 3;
  r.prompt = {};
  ExpectRefused(engine->Submit(r), "engine: request 3: prompt is empty");
  r.prompt = {1, 2};
  r.max_new_tokens = 0;
  ExpectRefused(engine->Submit(r), "engine: request 3: max_new_tokens = 0: expected >= 1");
  r.max_new_tokens = 4;
  r.num_samples = 0;
  ExpectRefused(engine->Submit(r), "engine: request 3: num_samples = 0: expected >= 1");
  r.id = UINT64_MAX;  // its sibling's id would wrap around to 0
  r.num_samples = 2;
  ExpectRefused(engine->Submit(r), "num_samples = 2: the sibling ids run past the largest");
  EXPECT_TRUE(engine->idle());
  // Overlapping ids name the request they clash with, queued or already running.
  r.id = 10;
  r.num_samples = 3;  // ids 10, 11, 12
  ASSERT_TRUE(engine->Submit(r).ok());
  GenerationRequest other = r;
  other.id = 12;
  other.num_samples = 1;
  ExpectRefused(engine->Submit(other), "request ids 12..12 overlap those of queued request 10");
  ASSERT_TRUE(engine->Step().ok());
  ASSERT_FALSE(engine->idle());
  other.id = 8;
  other.num_samples = 3;
  ExpectRefused(engine->Submit(other), "request ids 8..10 overlap those of running request 10");
  while (!engine->idle())
    ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->finished().size(), 3u);  // 10 and its two siblings: nothing else queued
}

}  // namespace
}  // namespace hkv
