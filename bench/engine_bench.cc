// Paged against contiguous attention in the reference engine: one decode step (Forward over one
// new position) for a batch of sequences of the same length, once through PagedKvCache views
// (K/V addressed through the manager's block tables, block by block) and once through private
// contiguous stores. Same model, same weights, same arithmetic; only the addressing differs, so
// the ratio of the two times is the cost of paging. Long contexts make attention dominate the
// step (projections and MLP are the same work on both sides). Compare the pairs side by side in
// one run; the goal is paged <= 1.15 x contiguous.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

constexpr int kBatch = 4;
const char* const kModels[] = {"meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                               "deepseek-ai--DeepSeek-V2-Lite"};

struct Setup {
  ModelSpec spec;
  ModelWeights weights;
  std::optional<KvCacheManager> manager;
  std::optional<PagedKvCache> cache;
  std::vector<std::unique_ptr<PagedKvCache::StepView>> views;
  std::vector<ContiguousKvStore> contiguous;
  std::vector<int32_t> tokens;
};

// kBatch sequences of `context` tokens whose K/V are in place (their values do not matter to
// the timing), each with an open one-token decode step.
std::unique_ptr<Setup> MakeSetup(int model, int64_t context, TensorLayout layout,
                                 benchmark::State& state) {
  auto s = std::make_unique<Setup>();
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + kModels[model], load);
  if (!real.ok()) {
    state.SkipWithError(real.status().ToString().c_str());
    return nullptr;
  }
  const TinyModelOptions o;
  s->spec = ScaleModel(*real, o).value();
  s->weights = ModelWeights::Random(s->spec, o.vocab, 3);
  PlanOptions po;
  po.block_tokens = 16;
  po.layout = layout;
  po.max_model_len = context + 16;
  po.seq_tokens = context + 1;
  po.memory_bytes =
      (kBatch + 1) * MakePlan(s->spec, po).value().FootprintOf(context + 1, 0).hybridkv_bytes;
  const Plan plan = MakePlan(s->spec, po).value();
  s->manager.emplace(KvCacheManager::Create(ManagerConfig::FromPlan(plan).value()).value());
  s->cache.emplace(PagedKvCache::Create(plan).value());
  for (int64_t i = 0; i <= context; ++i)
    s->tokens.push_back(static_cast<int32_t>(i * 31 % o.vocab));
  for (RequestId id = 1; id <= kBatch; ++id) {
    RequestSpec r;
    r.id = id;
    r.prompt = std::span<const int32_t>(s->tokens).first(static_cast<size_t>(context));
    KvCacheManager& m = *s->manager;
    if (!m.AddRequest(r).ok() || !m.Allocate(id, context).ok() || !m.Commit(id, context).ok() ||
        !m.AppendTokens(id, {&s->tokens[static_cast<size_t>(context)], 1}).ok() ||
        !m.Allocate(id, 1).ok()) {
      state.SkipWithError("setup: the manager refused the batch");
      return nullptr;
    }
    s->views.push_back(s->cache->View(m, id).value());
    s->contiguous.emplace_back(s->spec, context + 1, 0);
  }
  return s;
}

// paged: through the manager's tables in `layout`; else private contiguous stores.
void BM_DecodeStep(benchmark::State& state, bool paged, TensorLayout layout) {
  const int64_t context = state.range(1);
  auto s = MakeSetup(static_cast<int>(state.range(0)), context, layout, state);
  if (!s) return;
  for (auto _ : state) {
    for (int b = 0; b < kBatch; ++b) {
      KvStore& store = paged ? static_cast<KvStore&>(*s->views[static_cast<size_t>(b)])
                             : s->contiguous[static_cast<size_t>(b)];
      benchmark::DoNotOptimize(
          Forward(s->spec, s->weights, s->tokens, context, context + 1, store));
    }
  }
  state.SetLabel(kModels[state.range(0)]);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(kBatch), benchmark::Counter::kIsIterationInvariantRate);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t model = 0; model < 3; ++model) {
    for (int64_t context : {256, 1024, 4096})
      b->Args({model, context});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_DecodeStep, paged_canonical, true, TensorLayout::kCanonical)->Apply(Args);
BENCHMARK_CAPTURE(BM_DecodeStep, paged_per_layer, true, TensorLayout::kPerLayer)->Apply(Args);
BENCHMARK_CAPTURE(BM_DecodeStep, contiguous, false, TensorLayout::kCanonical)->Apply(Args);

}  // namespace
}  // namespace hkv
