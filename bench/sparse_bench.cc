// What a sparse-KV policy costs per decode step, next to the attention it shrinks. One request in
// steady decode through the Engine (scaled Llama-3.1-8B, 4 layers of full attention): with a
// policy at budget B, every step attends B + 1 tokens, feeds the weights back, scores, selects
// and evicts one token (Evict + row moves); without one ("none"), the request is prefilled to B
// tokens and every step attends them all (the cache grows by one per step, under 4% over the
// fixed 40 iterations at B >= 1024). The ratio policy / none at the same B is the overhead of
// scoring + compaction over a step dominated by attention. Compare side by side in one run.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <benchmark/benchmark.h>

#include <hkv/engine/engine.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

constexpr int64_t kIterations = 40;

void BM_SparseDecodeStep(benchmark::State& state, std::optional<PolicyKind> kind) {
  const int64_t budget = state.range(0);
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B", load);
  if (!real.ok()) {
    state.SkipWithError(real.status().ToString().c_str());
    return;
  }
  TinyModelOptions to;
  to.max_layers = 4;
  const ModelSpec spec = ScaleModel(*real, to).value();
  const ModelWeights weights = ModelWeights::Random(spec, to.vocab, 5);
  PlanOptions po;
  po.block_tokens = 16;
  po.max_model_len = 2 * budget + 4 * kIterations + 64;
  po.seq_tokens = po.max_model_len;
  po.memory_bytes = 2 * MakePlan(spec, po).value().FootprintOf(po.max_model_len, 0).hybridkv_bytes;
  const Plan plan = MakePlan(spec, po).value();
  const ManagerConfig config = ManagerConfig::FromPlan(plan).value();
  EngineOptions eo;
  eo.token_budget = 512;
  eo.chunk = 512;
  if (kind) {
    SparseKvOptions s;
    s.policy.kind = *kind;
    s.policy.recent = 8;
    s.budget = PolicyBudget::Tokens(budget).value();
    eo.sparse = s;
  }
  auto engine = Engine::Create(spec, weights, plan, config, eo).value();
  GenerationRequest g;
  g.id = 1;
  // With a policy the prompt is longer than the budget, so decode starts at the budget.
  const int64_t prompt = kind ? budget + 32 : budget;
  for (int64_t i = 0; i < prompt; ++i)
    g.prompt.push_back(static_cast<int32_t>(i * 31 % to.vocab));
  g.max_new_tokens = static_cast<int32_t>(4 * kIterations + 16);
  if (!engine->Submit(g).ok()) {
    state.SkipWithError("submit refused");
    return;
  }
  // Prefill (and the first decode step) outside the timing.
  while (engine->manager().Contains(1) ? engine->manager().NumComputed(1).value() < prompt : true) {
    if (!engine->Step().ok()) {
      state.SkipWithError("prefill step failed");
      return;
    }
  }
  for (auto _ : state) {
    if (!engine->Step().ok()) state.SkipWithError("decode step failed");
  }
  state.counters["evictions"] = static_cast<double>(engine->counters().evictions);
  state.SetLabel(kind ? std::string(PolicyKindName(*kind)) : std::string("none"));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t budget : {256, 1024, 4096})
    b->Arg(budget);
  b->Iterations(kIterations)->Repetitions(3)->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_SparseDecodeStep, none, std::nullopt)->Apply(Args);
BENCHMARK_CAPTURE(BM_SparseDecodeStep, streaming_llm, PolicyKind::kStreamingLlm)->Apply(Args);
BENCHMARK_CAPTURE(BM_SparseDecodeStep, h2o, PolicyKind::kH2O)->Apply(Args);
BENCHMARK_CAPTURE(BM_SparseDecodeStep, tova, PolicyKind::kTova)->Apply(Args);

}  // namespace
}  // namespace hkv
