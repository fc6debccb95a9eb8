// Manager time per replayed step with 256 and 1024 running requests, as `hkv simulate` measures
// it (the time inside manager calls, including building every scheduled request's block tables
// and slot mappings), for the three allocator modes of three model shapes.
//
// The trace: N requests arrive at step 0 with 512-token prompts (a 256-token shared prefix and
// 256 tokens of their own) and 256 outputs each; max running N and memory enough for all of them,
// so the replay admits them within a few budget-limited steps and then decodes N requests per
// step. Counters: mgr_us_per_step (mean over all steps), p99_us, peak_running, steps.
#include <numeric>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/manager/allocator_mode.h>
#include <hkv/sim/replayer.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

const char* const kModels[] = {"meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                               "ibm-ai-platform--Bamba-9B"};

Trace SteadyTrace(int64_t n) {
  Trace trace;
  for (int64_t i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = i;
    r.prompt.resize(512);
    std::iota(r.prompt.begin(), r.prompt.begin() + 256, 1);
    std::iota(r.prompt.begin() + 256, r.prompt.end(), static_cast<int32_t>(1000 + i * 256));
    r.output_len = 256;
    trace.push_back(std::move(r));
  }
  return trace;
}

void BM_ReplayStep(benchmark::State& state) {
  const auto model_index = static_cast<size_t>(state.range(0));
  const auto mode = static_cast<AllocatorMode>(state.range(1));
  const int64_t running = state.range(2);
  auto model = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + kModels[model_index]);
  if (!model.ok()) {
    state.SkipWithError(model.status().ToString().c_str());
    return;
  }
  PlanOptions ao;
  ao.memory_bytes = int64_t{400} << 30;
  ao.max_model_len = 2048;
  ao.seq_tokens = 768;
  auto allocator = MakeAllocator(*model, mode, ao);
  if (!allocator.ok()) {
    state.SkipWithError(allocator.status().ToString().c_str());
    return;
  }
  const Trace trace = SteadyTrace(running);
  ReplayOptions ro;
  ro.max_running = static_cast<int32_t>(running);
  ro.max_model_len = 2048;
  double mean = 0, p99 = 0;
  int64_t steps = 0, peak = 0;
  for (auto _ : state) {
    auto report = Replay(trace, allocator->config, ro);
    if (!report.ok()) {
      state.SkipWithError(report.status().ToString().c_str());
      return;
    }
    const StepTimes t = report->manager_times();
    mean = t.mean;
    p99 = t.p99;
    steps = report->steps;
    peak = report->peak_running;
  }
  state.counters["mgr_us_per_step"] = mean;
  state.counters["p99_us"] = p99;
  state.counters["steps"] = static_cast<double>(steps);
  state.counters["peak_running"] = static_cast<double>(peak);
  state.SetLabel(std::string(kModels[model_index]) + " " + std::string(AllocatorModeName(mode)));
}

BENCHMARK(BM_ReplayStep)
    ->ArgNames({"model", "mode", "running"})
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {256, 1024}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hkv
