// MakePlan and the capacity queries on hand-built models shaped like real ones. A plan is made
// once per model load, so MakePlan only needs to be quick; FootprintOf and MaxSequences are what a
// capacity sweep (hkv plan, the simulator) calls in loops.
#include <benchmark/benchmark.h>

#include <hkv/plan/plan.h>

namespace hkv {
namespace {

LayerSpec Attention(int32_t layer, LayerKind kind, int32_t window = 0) {
  LayerSpec l;
  l.layer = layer;
  l.kind = kind;
  l.num_q_heads = 32;
  l.num_kv_heads = 8;
  l.head_dim_k = 128;
  l.head_dim_v = 128;
  l.window = window;
  return l;
}

LayerSpec Mamba(int32_t layer) {
  LayerSpec l;
  l.layer = layer;
  l.kind = LayerKind::kMamba1;
  l.state = {{"conv", {3, 8192}, DType::kBF16}, {"ssm", {8192, 16}, DType::kBF16}};
  return l;
}

ModelSpec Model(std::vector<LayerSpec> layers, int64_t max_pos) {
  ModelSpec m;
  m.source = "bench";
  m.max_position_embeddings = max_pos;
  m.layers = std::move(layers);
  m.num_layers = m.layers.back().layer + 1;
  return m;
}

// 62 layers, 5 sliding (window 1024) per full one: the padding-versus-classes choice matters.
ModelSpec Gemma3Like() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 62; ++i) {
    layers.push_back(i % 6 == 5 ? Attention(i, LayerKind::kFullAttention)
                                : Attention(i, LayerKind::kSlidingWindow, 1024));
  }
  return Model(std::move(layers), 131072);
}

// 32 layers, one attention layer in eight, Mamba elsewhere.
ModelSpec JambaLike() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 32; ++i) {
    layers.push_back(i % 8 == 4 ? Attention(i, LayerKind::kFullAttention) : Mamba(i));
  }
  return Model(std::move(layers), 262144);
}

// 40 layers, cross attention every fifth.
ModelSpec MllamaLike() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 40; ++i) {
    layers.push_back(
        Attention(i, i % 5 == 3 ? LayerKind::kCrossAttention : LayerKind::kFullAttention));
  }
  ModelSpec m = Model(std::move(layers), 131072);
  m.max_encoder_tokens = 6404;
  return m;
}

ModelSpec ModelNumber(int64_t i) {
  switch (i) {
    case 0:
      return Gemma3Like();
    case 1:
      return JambaLike();
    default:
      return MllamaLike();
  }
}

PlanOptions BenchOptions(TensorLayout layout) {
  PlanOptions o;
  o.memory_bytes = int64_t{64} << 30;
  o.max_model_len = 32768;
  o.layout = layout;
  return o;
}

void BM_MakePlan(benchmark::State& state) {
  const ModelSpec model = ModelNumber(state.range(0));
  const PlanOptions options = BenchOptions(static_cast<TensorLayout>(state.range(1)));
  for (auto _ : state) {
    Result<Plan> plan = MakePlan(model, options);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(BM_MakePlan)->ArgNames({"model", "per_layer"})->ArgsProduct({{0, 1, 2}, {0, 1}});

void BM_FootprintOf(benchmark::State& state) {
  const Plan plan =
      MakePlan(ModelNumber(state.range(0)), BenchOptions(TensorLayout::kCanonical)).value();
  int64_t tokens = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(plan.FootprintOf(tokens, 0));
    tokens = tokens % 32768 + 97;
  }
}
BENCHMARK(BM_FootprintOf)->ArgName("model")->DenseRange(0, 2);

void BM_MaxSequences(benchmark::State& state) {
  const Plan plan =
      MakePlan(ModelNumber(state.range(0)), BenchOptions(TensorLayout::kCanonical)).value();
  int64_t tokens = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(plan.MaxSequences(tokens, 0));
    tokens = tokens % 32768 + 97;
  }
}
BENCHMARK(BM_MaxSequences)->ArgName("model")->DenseRange(0, 2);

}  // namespace
}  // namespace hkv
