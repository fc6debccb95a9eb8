// A hand-driven paged run for the engine tests: one scaled model, its plan, a manager and the
// paged cache, and a generation loop that does each step by the manager's book (Allocate, Step,
// copies, View, Forward, Commit), so tests can stop it anywhere and compare with dense.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace hkv::testing {

struct Harness {
  ModelSpec spec;
  ModelWeights weights;
  Plan plan;
  std::optional<KvCacheManager> manager;
  std::optional<PagedKvCache> cache;
  EncoderInput encoder;  // every request's image on a cross-attention model
};

inline ModelSpec LoadScaled(const std::string& model, const TinyModelOptions& o = {}) {
  LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + model, load);
  EXPECT_TRUE(real.ok()) << real.status().ToString();
  if (!real.ok()) return {};
  auto tiny = ScaleModel(*real, o);
  EXPECT_TRUE(tiny.ok()) << tiny.status().ToString();
  return tiny.ok() ? *tiny : ModelSpec{};
}

// checkpoint_interval 0 means align_tokens.
inline Harness Make(const std::string& model, const TinyModelOptions& o = {},
                    int64_t checkpoint_interval = 0) {
  Harness s;
  s.spec = LoadScaled(model, o);
  if (s.spec.max_encoder_tokens > 0) s.encoder = {7, s.spec.max_encoder_tokens};
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
  // Recurrent hits land on checkpoints.
  config->checkpoint_interval =
      checkpoint_interval > 0 ? checkpoint_interval : config->align_tokens();
  s.manager.emplace(KvCacheManager::Create(*config).value());
  s.cache.emplace(PagedKvCache::Create(s.plan).value());
  return s;
}

struct Generation {
  std::vector<int32_t> tokens;
  std::map<int64_t, std::vector<float>> logits;  // per computed position
  int64_t hit = 0;
};

inline Status AddRequest(Harness& s, RequestId id, const std::vector<int32_t>& prompt) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt = prompt;
  spec.encoder_tokens = s.encoder.tokens;
  spec.encoder_input = {s.encoder.image, 0x1a6e};
  return s.manager->AddRequest(spec);
}

// Runs the open step of request `id` over `tokens` and records its logits.
inline void RunOpenStep(Harness& s, RequestId id, const std::vector<int32_t>& tokens,
                        Generation& g) {
  KvCacheManager& m = *s.manager;
  const StepInfo step = m.Step(id).value();
  s.cache->ApplyCopies(step.copies);
  auto view = s.cache->View(m, id);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const std::vector<float> logits =
      Forward(s.spec, s.weights, tokens, step.begin, step.end, **view, s.encoder);
  EXPECT_TRUE((*view)->status().ok()) << (*view)->status().ToString();
  const auto vocab = static_cast<size_t>(s.weights.vocab);
  for (int64_t p = step.begin; p < step.end; ++p) {
    const auto row = static_cast<size_t>(p - step.begin) * vocab;
    g.logits[p].assign(logits.begin() + static_cast<ptrdiff_t>(row),
                       logits.begin() + static_cast<ptrdiff_t>(row + vocab));
  }
}

// Continues request `id` (already added and started, or just looked up with `hit`): prefills in
// chunks, then decodes greedily until `new_tokens` tokens follow `prompt_len`; every step's K/V
// go through the manager.
inline void Continue(Harness& s, RequestId id, Generation& g, size_t prompt_len, int64_t chunk,
                     int new_tokens, PrefixHit hit = {}) {
  KvCacheManager& m = *s.manager;
  int64_t computed = hit.tokens > 0 ? hit.tokens : m.NumComputed(id).value();
  while (static_cast<int>(g.tokens.size() - prompt_len) < new_tokens) {
    const int64_t known = static_cast<int64_t>(g.tokens.size());
    const int64_t n = std::min(chunk, known - computed);
    Status st = m.Allocate(id, n, hit);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return;
    EXPECT_TRUE(
        s.cache->PoisonFreeBlocks(m).ok());  // blocks the step took may not be read before written
    hit = {};
    RunOpenStep(s, id, g.tokens, g);
    const int64_t end = m.Step(id).value().end;
    EXPECT_TRUE(m.Commit(id, end).ok());
    EXPECT_TRUE(s.cache->PoisonFreeBlocks(m).ok());
    EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
    computed = end;
    if (computed == known) {
      const int32_t next = Argmax(g.logits[computed - 1]);
      g.tokens.push_back(next);
      EXPECT_TRUE(m.AppendTokens(id, {&next, 1}).ok());
    }
  }
}

// Adds request `id`, takes its prefix hit, and generates.
inline Generation Generate(Harness& s, RequestId id, const std::vector<int32_t>& prompt,
                           int64_t chunk, int new_tokens) {
  Generation g;
  g.tokens = prompt;
  EXPECT_TRUE(AddRequest(s, id, prompt).ok());
  const PrefixHit hit = s.manager->Lookup(id).value();
  g.hit = hit.tokens;
  Continue(s, id, g, prompt.size(), chunk, new_tokens, hit);
  return g;
}

// The paged run's tokens are what greedy decoding of the dense model gives, and every logit the
// paged run computed matches the dense one.
inline void ExpectMatchesDense(const Harness& s, const Generation& g, size_t prompt_len) {
  const std::vector<float> dense = DenseLogits(s.spec, s.weights, g.tokens, s.encoder);
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

inline std::vector<int32_t> Prompt(int32_t n, uint32_t seed) {
  std::vector<int32_t> t;
  uint32_t x = seed;
  for (int32_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>((x >> 8) % 97));
  }
  return t;
}

}  // namespace hkv::testing
