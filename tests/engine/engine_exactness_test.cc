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

namespace hkv {
namespace {

struct Harness {
  ModelSpec spec;
  ModelWeights weights;
  Plan plan;
  std::optional<KvCacheManager> manager;
  std::optional<PagedKvCache> cache;
};

Harness Make(const std::string& model, const TinyModelOptions& o = {}) {
  Harness s;
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + model, load);
  EXPECT_TRUE(real.ok()) << real.status().ToString();
  auto tiny = ScaleModel(*real, o);
  EXPECT_TRUE(tiny.ok()) << tiny.status().ToString();
  s.spec = *tiny;
  s.weights = ModelWeights::Random(s.spec, o.vocab, 42);
  PlanOptions po;
  po.memory_bytes = int64_t{2} << 20;
  po.block_tokens = 4;
  po.max_model_len = 256;
  auto plan = MakePlan(s.spec, po);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  s.plan = *plan;
  auto config = ManagerConfig::FromPlan(s.plan);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  config->checkpoint_interval = config->align_tokens();  // recurrent hits land on these
  s.manager.emplace(KvCacheManager::Create(*config).value());
  s.cache.emplace(PagedKvCache::Create(s.plan).value());
  return s;
}

struct Generation {
  std::vector<int32_t> tokens;
  std::map<int64_t, std::vector<float>> logits;  // per computed position
  int64_t hit = 0;
};

// Prefills in chunks, then decodes greedily; every step's K/V go through the manager.
Generation Generate(Harness& s, RequestId id, const std::vector<int32_t>& prompt, int64_t chunk,
                    int new_tokens) {
  Generation g;
  g.tokens = prompt;
  KvCacheManager& m = *s.manager;
  RequestSpec spec;
  spec.id = id;
  spec.prompt = prompt;
  EXPECT_TRUE(m.AddRequest(spec).ok());
  PrefixHit hit = m.Lookup(id).value();
  g.hit = hit.tokens;
  int64_t computed = hit.tokens;
  const auto vocab = static_cast<size_t>(s.weights.vocab);
  while (static_cast<int>(g.tokens.size() - prompt.size()) < new_tokens) {
    const int64_t known = static_cast<int64_t>(g.tokens.size());
    const int64_t n = std::min(chunk, known - computed);
    Status st = m.Allocate(id, n, hit);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return g;
    hit = {};
    const StepInfo step = m.Step(id).value();
    s.cache->ApplyCopies(step.copies);
    auto view = s.cache->View(m, id);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    const std::vector<float> logits =
        Forward(s.spec, s.weights, g.tokens, step.begin, step.end, **view);
    EXPECT_TRUE((*view)->status().ok()) << (*view)->status().ToString();
    for (int64_t p = step.begin; p < step.end; ++p) {
      const auto row = static_cast<size_t>(p - step.begin) * vocab;
      g.logits[p].assign(logits.begin() + static_cast<ptrdiff_t>(row),
                         logits.begin() + static_cast<ptrdiff_t>(row + vocab));
    }
    EXPECT_TRUE(m.Commit(id, step.end).ok());
    EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
    computed = step.end;
    if (computed == known) {
      const int32_t next = Argmax(g.logits[computed - 1]);
      g.tokens.push_back(next);
      EXPECT_TRUE(m.AppendTokens(id, {&next, 1}).ok());
    }
  }
  return g;
}

// The paged run's tokens are what greedy decoding of the dense model gives, and every logit the
// paged run computed matches the dense one.
void ExpectMatchesDense(const Harness& s, const Generation& g, size_t prompt_len) {
  const std::vector<float> dense = DenseLogits(s.spec, s.weights, g.tokens);
  const auto vocab = static_cast<size_t>(s.weights.vocab);
  float worst = 0.0f;
  for (const auto& [p, row] : g.logits) {
    for (size_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, std::fabs(row[i] - dense[static_cast<size_t>(p) * vocab + i]));
    }
  }
  EXPECT_LE(worst, 1e-4f);
  for (size_t p = prompt_len; p < g.tokens.size(); ++p) {
    const std::span<const float> row(dense.data() + (p - 1) * vocab, vocab);
    EXPECT_EQ(g.tokens[p], Argmax(row)) << "generated token at " << p;
  }
}

std::vector<int32_t> Prompt(int32_t n, uint32_t seed) {
  std::vector<int32_t> t;
  uint32_t x = seed;
  for (int32_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>((x >> 8) % 97));
  }
  return t;
}

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

TEST(TinyModel, RefusesKindsTheEngineCannotRunYet) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto mla = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/deepseek-ai--DeepSeek-V2-Lite", load);
  ASSERT_TRUE(mla.ok());
  auto tiny = ScaleModel(*mla, {});
  EXPECT_EQ(tiny.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(tiny.status().message().find("mla"), std::string::npos) << tiny.status().message();
}

TEST(TinyModel, KeepsThePatternAndScalesSpans) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
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
