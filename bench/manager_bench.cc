// KvCacheManager costs on the paths an engine drives every step, through the public API only:
// - one request's life (add, lookup, allocate its prefill, commit, free), a fork and a truncate,
//   at pool sizes from 1k to 100k blocks with the prefix cache full, split per call;
// - whole scheduler steps over 256 and 1024 running requests of three real model shapes (full
//   attention, sliding window, Mamba hybrid), to compare with an engine's Python manager;
// - heap allocations per step, counted by replacing the global operator new below. The manager
//   promises none in steady state with events off, so allocs_per_step should read 0.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/common/result.h>
#include <hkv/common/status.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/manager/manager_config.h>
#include <hkv/manager/request.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

// ---- Allocation counter -------------------------------------------------------------------------
// Every form of operator new counts one allocation and goes to malloc; the deletes go to free. A
// relaxed atomic keeps the count exact and costs a few nanoseconds per allocation, which only
// shows where allocations happen anyway.

namespace {
std::atomic<int64_t> g_allocations{0};

void* CountedAlloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}

void* CountedAlignedAlloc(std::size_t n, std::align_val_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(align);
  // aligned_alloc wants a size that is a multiple of the alignment.
  return std::aligned_alloc(a, (std::max<std::size_t>(n, 1) + a - 1) / a * a);
}

// Out of line: once a delete is inlined into its caller, GCC sees free() on a pointer from
// operator new and warns (-Wmismatched-new-delete), not knowing that new is malloc here.
[[gnu::noinline]] void CountedFree(void* p) noexcept {
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = CountedAlignedAlloc(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = CountedAlignedAlloc(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return CountedAlignedAlloc(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return CountedAlignedAlloc(n, a);
}
void operator delete(void* p) noexcept {
  CountedFree(p);
}
void operator delete[](void* p) noexcept {
  CountedFree(p);
}
void operator delete(void* p, std::size_t) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  CountedFree(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  CountedFree(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  CountedFree(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  CountedFree(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  CountedFree(p);
}

namespace hkv {
namespace {

int64_t Allocations() {
  return g_allocations.load(std::memory_order_relaxed);
}

// ---- Models -------------------------------------------------------------------------------------

struct ModelCase {
  const char* dir;  // under models/
  const char* name;
};

// Full attention, Gemma-2's alternating 4096-token window, and a Mamba-2 hybrid with three
// attention layers: the shapes engines report manager overhead for.
constexpr std::array<ModelCase, 3> kModels = {{
    {"meta-llama--Llama-3.1-8B", "llama3.1-8b"},
    {"google--gemma-2-9b", "gemma2-9b"},
    {"ibm-ai-platform--Bamba-9B", "bamba-9b"},
}};
constexpr int kLlama = 0;

std::filesystem::path ModelsDir() {
#ifdef HKV_MODELS_DIR
  return HKV_MODELS_DIR;
#else
  // The build passes absolute source paths, so the bundled configs sit at ../models from here.
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "models";
#endif
}

// The manager config FromPlan derives for a bundled model, with events off. Parsed once per model
// because Google Benchmark calls a benchmark function several times while it picks iterations.
Result<ManagerConfig> ModelConfig(int model) {
  static std::array<std::optional<ManagerConfig>, kModels.size()> cache;
  std::optional<ManagerConfig>& slot = cache[static_cast<size_t>(model)];
  if (!slot) {
    HKV_ASSIGN_OR_RETURN(ModelSpec spec,
                         LoadModelConfig(ModelsDir() / kModels[static_cast<size_t>(model)].dir));
    HKV_ASSIGN_OR_RETURN(Plan plan, MakePlan(spec, PlanOptions{}));
    HKV_ASSIGN_OR_RETURN(ManagerConfig config, ManagerConfig::FromPlan(plan));
    config.record_events = false;
    slot = std::move(config);
  }
  return *slot;
}

Result<KvCacheManager> MakeManager(int model, const std::vector<int32_t>& pool_blocks) {
  HKV_ASSIGN_OR_RETURN(ManagerConfig config, ModelConfig(model));
  if (pool_blocks.size() != config.pool_blocks.size()) {
    return Status::InvalidArgument("manager_bench: pool count does not match the model's config");
  }
  config.pool_blocks = pool_blocks;
  if (config.arena.enabled()) {
    // Two-level memory (Bamba): enough shared slabs that every pool can hold what it was asked.
    int64_t slabs = 1;
    for (size_t p = 0; p < pool_blocks.size(); ++p) {
      const int64_t per = config.arena.pages_per_slab[p];
      slabs = std::max(slabs, (pool_blocks[p] - 1 + per - 1) / per);
    }
    config.arena.num_slabs = slabs;
    for (size_t p = 0; p < pool_blocks.size(); ++p) {
      config.pool_blocks[p] = static_cast<int32_t>(
          std::min<int64_t>(slabs * config.arena.pages_per_slab[p] + 1, INT32_MAX));
    }
  }
  return KvCacheManager::Create(config);
}

// Token ids that look like text: spread over a 32k vocabulary, no runs.
int32_t TextToken(int64_t i) {
  return static_cast<int32_t>((i * 7919 + 13) % 32000);
}

// Marks a prompt as new from position `at` on: every block from there gets a new digest, while
// the blocks before `at` keep the digests of the prefix all prompts share.
void Stamp(std::vector<int32_t>& prompt, int64_t at, uint64_t unique) {
  if (at >= static_cast<int64_t>(prompt.size())) return;
  prompt[static_cast<size_t>(at)] = 100000 + static_cast<int32_t>(unique % 1000000000);
}

// Stops the benchmark on the first failed call and says why; the loop must break after it.
bool Check(benchmark::State& state, const Status& status) {
  if (status.ok()) return true;
  state.SkipWithError(status.ToString().c_str());
  return false;
}

// Splits each iteration's time between the calls it makes. A steady_clock reading costs about
// 20 ns, so a call's share includes that much overhead and the shares add up to slightly more
// than the iteration time.
class Splits {
 public:
  using Clock = std::chrono::steady_clock;

  void Start() { last_ = Clock::now(); }
  void Lap(size_t part) {
    const Clock::time_point now = Clock::now();
    sums_[part] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
  }
  // One counter "<name>_ns" per part, averaged over the iterations.
  void Report(benchmark::State& state, std::initializer_list<const char*> names) const {
    size_t i = 0;
    for (const char* name : names) {
      state.counters[std::string(name) + "_ns"] =
          benchmark::Counter(static_cast<double>(sums_[i++]), benchmark::Counter::kAvgIterations);
    }
  }

 private:
  std::array<int64_t, 8> sums_{};
  Clock::time_point last_;
};

// A few untimed cycles first: the manager's scratch buffers grow to their working size on first
// use, and some paths (a truncate releasing blocks with no identity) only run from the second
// cycle on.
template <typename Cycle>
Status WarmUp(const Cycle& cycle, Splits& splits) {
  for (int i = 0; i < 3; ++i)
    HKV_RETURN_IF_ERROR(cycle(splits));
  return Status::Ok();
}

void ReportAllocations(benchmark::State& state, int64_t before, const char* name) {
  state.counters[name] = benchmark::Counter(static_cast<double>(Allocations() - before),
                                            benchmark::Counter::kAvgIterations);
}

// ---- Per-call costs at pool sizes 1k, 10k, 100k blocks -----------------------------------------
// Llama-3.1-8B's config (one full-attention group of 16-token blocks) with the pool set to the
// benchmark's size. Before timing, the pool is filled with cached blocks of unrelated prompts, so
// allocations evict and the prefix index holds one identity per block, and a 2048-token prompt
// is cached last (at the tail of the LRU order, so it survives what the iterations evict).

constexpr int64_t kPromptTokens = 2048;
constexpr RequestId kFillIds = RequestId{1} << 40;

std::vector<int32_t> BasePrompt(int64_t tokens) {
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i)
    prompt[static_cast<size_t>(i)] = TextToken(i);
  return prompt;
}

// Runs a request's prompt through one prefill; unless `keep`, frees it, leaving its blocks cached.
Status Prefill(KvCacheManager& m, RequestId id, std::span<const int32_t> prompt, bool keep) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt = prompt;
  HKV_RETURN_IF_ERROR(m.AddRequest(spec));
  HKV_ASSIGN_OR_RETURN(PrefixHit hit, m.Lookup(id));
  const auto n = static_cast<int64_t>(prompt.size());
  HKV_RETURN_IF_ERROR(m.Allocate(id, n - hit.tokens, hit));
  HKV_RETURN_IF_ERROR(m.Commit(id, n));
  return keep ? Status::Ok() : m.Free(id);
}

// A manager whose pool of `blocks` blocks is full of cached blocks, the base prompt's last.
Result<KvCacheManager> WarmManager(int32_t blocks) {
  HKV_ASSIGN_OR_RETURN(KvCacheManager m, MakeManager(kLlama, {blocks}));
  const int32_t block_tokens = m.config().groups[0].block_tokens;
  const int64_t per_request = kPromptTokens / block_tokens;
  std::vector<int32_t> prompt = BasePrompt(kPromptTokens);
  for (int64_t r = 0; r * per_request < blocks; ++r) {
    Stamp(prompt, 0, kFillIds + static_cast<uint64_t>(r));
    HKV_RETURN_IF_ERROR(Prefill(m, kFillIds + static_cast<RequestId>(r), prompt, false));
  }
  HKV_RETURN_IF_ERROR(Prefill(m, kFillIds - 1, BasePrompt(kPromptTokens), false));
  return m;
}

// A request's life with a 2048-token prompt whose first `shared` tokens are cached (0: a cold
// prompt; 2048: the whole prompt, of which the hit takes all but the last block). The uncached
// part is new in every iteration, so each iteration also evicts that many cached blocks.
void BM_RequestCycle(benchmark::State& state) {
  Result<KvCacheManager> made = WarmManager(static_cast<int32_t>(state.range(0)));
  if (!Check(state, made.status())) return;
  KvCacheManager& m = *made;
  const int64_t shared = state.range(1);
  std::vector<int32_t> prompt = BasePrompt(kPromptTokens);
  RequestSpec spec;
  spec.prompt = prompt;
  RequestId id = 1;
  int64_t hit_tokens = 0;
  enum Part : size_t { kAdd, kLookup, kAllocate, kCommit, kFree };
  const auto cycle = [&](Splits& splits) -> Status {
    Stamp(prompt, shared, id);
    spec.id = id++;
    splits.Start();
    HKV_RETURN_IF_ERROR(m.AddRequest(spec));
    splits.Lap(kAdd);
    HKV_ASSIGN_OR_RETURN(const PrefixHit hit, m.Lookup(spec.id));
    splits.Lap(kLookup);
    HKV_RETURN_IF_ERROR(m.Allocate(spec.id, kPromptTokens - hit.tokens, hit));
    splits.Lap(kAllocate);
    HKV_RETURN_IF_ERROR(m.Commit(spec.id, kPromptTokens));
    splits.Lap(kCommit);
    HKV_RETURN_IF_ERROR(m.Free(spec.id));
    splits.Lap(kFree);
    hit_tokens += hit.tokens;
    return Status::Ok();
  };
  Splits warm, splits;
  if (!Check(state, WarmUp(cycle, warm))) return;
  hit_tokens = 0;
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, cycle(splits))) break;
  }
  ReportAllocations(state, allocations, "allocs_per_iter");
  splits.Report(state, {"add", "lookup", "allocate", "commit", "free"});
  state.counters["hit_tokens"] =
      benchmark::Counter(static_cast<double>(hit_tokens), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RequestCycle)
    ->ArgNames({"pool", "shared"})
    ->ArgsProduct({{1 << 10, 10 << 10, 100 << 10}, {0, 1024, 2048}});

// Lookup alone: it never mutates, so it repeats on one added request with no reset.
void TimeLookup(benchmark::State& state, KvCacheManager& m, RequestId id,
                std::span<const int32_t> prompt) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt = prompt;
  if (!Check(state, m.AddRequest(spec))) return;
  if (!Check(state, m.Lookup(id).status())) return;  // scratch buffers grow on first use
  int64_t hit_tokens = 0;
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    const Result<PrefixHit> hit = m.Lookup(id);
    if (!Check(state, hit.status())) break;
    hit_tokens += hit->tokens;
  }
  ReportAllocations(state, allocations, "allocs_per_iter");
  state.counters["hit_tokens"] =
      benchmark::Counter(static_cast<double>(hit_tokens), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations());
}

// The whole 2048-token prompt is cached; the hit is 2032 tokens (127 blocks).
void BM_Lookup(benchmark::State& state) {
  Result<KvCacheManager> made = WarmManager(static_cast<int32_t>(state.range(0)));
  if (!Check(state, made.status())) return;
  TimeLookup(state, *made, 1, BasePrompt(kPromptTokens));
}
BENCHMARK(BM_Lookup)->ArgName("pool")->Arg(1 << 10)->Arg(10 << 10)->Arg(100 << 10);

// A conversation's next turn: the previous 2048-token turn is cached, the new prompt adds 1024
// tokens nobody computed. The hit search must find the cached part without paying for the new
// one; a window group scanning down from the prompt's end would probe every new block first.
void BM_LookupNextTurn(benchmark::State& state) {
  const auto model = static_cast<int>(state.range(0));
  constexpr int64_t kTurn = 2048, kNew = 1024;
  Result<ManagerConfig> config = ModelConfig(model);
  if (!Check(state, config.status())) return;
  std::vector<int32_t> pools(config->pool_blocks.size(), 4096);
  Result<KvCacheManager> made = MakeManager(model, pools);
  if (!Check(state, made.status())) return;
  KvCacheManager& m = *made;
  std::vector<int32_t> prompt = BasePrompt(kTurn + kNew);
  if (!Check(state, Prefill(m, 1, std::span<const int32_t>(prompt).first(kTurn), false))) return;
  Stamp(prompt, kTurn, 7);
  state.SetLabel(kModels[static_cast<size_t>(model)].name);
  TimeLookup(state, m, 2, prompt);
}
BENCHMARK(BM_LookupNextTurn)->ArgName("model")->DenseRange(0, 2);

// A waiting head refused step after step: memory is full of running requests but for one
// request's worth, which caches the previous 2048-token turn; the next turn (up to 4096 new
// tokens) hits it and still does not fit. Each iteration is what a scheduler asks for the head
// every step: Lookup, then the first Allocate, refused (nothing changes).
void BM_RefusedAdmission(benchmark::State& state) {
  const auto model = static_cast<int>(state.range(0));
  constexpr int64_t kTurn = 2048;
  Result<ManagerConfig> config = ModelConfig(model);
  if (!Check(state, config.status())) return;
  const int64_t kNew = std::min<int64_t>(4096, config->max_model_len - kTurn);
  std::vector<int32_t> pools(config->pool_blocks.size(), 4096);
  Result<KvCacheManager> made = MakeManager(model, pools);
  if (!Check(state, made.status())) return;
  KvCacheManager& m = *made;
  std::vector<int32_t> prompt = BasePrompt(kTurn + kNew);
  // Running requests of one turn's size until the next one does not fit; then one leaves.
  RequestId filler = kFillIds;
  for (;; ++filler) {
    std::vector<int32_t> other = BasePrompt(kTurn);
    Stamp(other, 0, kFillIds + static_cast<uint64_t>(filler));
    const Status s = Prefill(m, filler, other, true);
    if (s.code() == StatusCode::kResourceExhausted) {
      if (!Check(state, m.Free(filler))) return;
      break;
    }
    if (!Check(state, s)) return;
  }
  if (!Check(state, m.Free(kFillIds))) return;
  if (!Check(state, Prefill(m, 1, std::span<const int32_t>(prompt).first(kTurn), false))) return;
  Stamp(prompt, kTurn, 7);
  RequestSpec spec;
  spec.id = 2;
  spec.prompt = prompt;
  if (!Check(state, m.AddRequest(spec))) return;
  const auto admit = [&] {
    const Result<PrefixHit> hit = m.Lookup(2);
    if (!hit.ok()) return hit.status();
    const int64_t rest = kTurn + kNew - hit->tokens;
    return m.Allocate(2, rest, *hit);
  };
  if (admit().code() != StatusCode::kResourceExhausted) {
    state.SkipWithError("the waiting request fits: the benchmark's memory is not full");
    return;
  }
  for (auto _ : state) {
    const Status refused = admit();
    benchmark::DoNotOptimize(refused.code());
  }
  state.SetLabel(kModels[static_cast<size_t>(model)].name);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RefusedAdmission)->ArgName("model")->DenseRange(0, 2);

// Parallel sampling: a child forked from a 2040-token parent (last block partly filled) decodes
// one token, which copies the shared partial block, and is freed.
void BM_ForkCycle(benchmark::State& state) {
  Result<KvCacheManager> made = WarmManager(static_cast<int32_t>(state.range(0)));
  if (!Check(state, made.status())) return;
  KvCacheManager& m = *made;
  constexpr int64_t kParentTokens = kPromptTokens - 8;
  const std::vector<int32_t> prompt = BasePrompt(kParentTokens);
  constexpr RequestId kParent = 1;
  if (!Check(state, Prefill(m, kParent, prompt, true))) return;
  const int32_t sampled = TextToken(kParentTokens);
  if (!Check(state, m.AppendTokens(kParent, std::span<const int32_t>(&sampled, 1)))) return;
  RequestId child = 2;
  int64_t copies = 0;
  enum Part : size_t { kFork, kAllocate, kStep, kCommit, kFree };
  const auto cycle = [&](Splits& splits) -> Status {
    splits.Start();
    HKV_RETURN_IF_ERROR(m.Fork(kParent, child));
    splits.Lap(kFork);
    HKV_RETURN_IF_ERROR(m.Allocate(child, 1));
    splits.Lap(kAllocate);
    HKV_ASSIGN_OR_RETURN(const StepInfo step, m.Step(child));
    splits.Lap(kStep);
    copies += static_cast<int64_t>(step.copies.size());
    HKV_RETURN_IF_ERROR(m.Commit(child, kParentTokens + 1));
    splits.Lap(kCommit);
    HKV_RETURN_IF_ERROR(m.Free(child++));
    splits.Lap(kFree);
    return Status::Ok();
  };
  Splits warm, splits;
  if (!Check(state, WarmUp(cycle, warm))) return;
  copies = 0;
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, cycle(splits))) break;
  }
  ReportAllocations(state, allocations, "allocs_per_iter");
  splits.Report(state, {"fork", "allocate", "step", "commit", "free"});
  state.counters["copies"] =
      benchmark::Counter(static_cast<double>(copies), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ForkCycle)->ArgName("pool")->Arg(1 << 10)->Arg(10 << 10)->Arg(100 << 10);

// Speculative-decoding rollback: a request that decoded 64 tokens after its 2048-token prompt
// drops its last 32 and computes them again (append the tokens back, allocate, commit).
void BM_TruncateCycle(benchmark::State& state) {
  Result<KvCacheManager> made = WarmManager(static_cast<int32_t>(state.range(0)));
  if (!Check(state, made.status())) return;
  KvCacheManager& m = *made;
  constexpr RequestId kId = 1;
  constexpr int64_t kDecoded = 64, kDropped = 32;
  constexpr int64_t kEnd = kPromptTokens + kDecoded;  // computed positions
  const std::vector<int32_t> text = BasePrompt(kEnd + 1);
  if (!Check(state, Prefill(m, kId, std::span(text).first(kPromptTokens), true))) return;
  // The token sampled at each position is appended first, then computed by the next step.
  for (int64_t p = kPromptTokens; p < kEnd; ++p) {
    if (!Check(state, m.AppendTokens(kId, std::span(text).subspan(static_cast<size_t>(p), 1))) ||
        !Check(state, m.Allocate(kId, 1)) || !Check(state, m.Commit(kId, p + 1))) {
      return;
    }
  }
  if (!Check(state, m.AppendTokens(kId, std::span(text).subspan(kEnd, 1)))) return;
  int64_t recompute = 0;
  enum Part : size_t { kTruncate, kAppend, kAllocate, kCommit };
  const auto cycle = [&](Splits& splits) -> Status {
    splits.Start();
    HKV_ASSIGN_OR_RETURN(const TruncateResult cut, m.Truncate(kId, kEnd - kDropped));
    splits.Lap(kTruncate);
    HKV_RETURN_IF_ERROR(m.AppendTokens(kId, std::span(text).subspan(cut.tokens)));
    splits.Lap(kAppend);
    HKV_RETURN_IF_ERROR(m.Allocate(kId, kEnd - cut.computed));
    splits.Lap(kAllocate);
    HKV_RETURN_IF_ERROR(m.Commit(kId, kEnd));
    splits.Lap(kCommit);
    recompute += cut.recompute;
    return Status::Ok();
  };
  Splits warm, splits;
  if (!Check(state, WarmUp(cycle, warm))) return;
  recompute = 0;
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, cycle(splits))) break;
  }
  ReportAllocations(state, allocations, "allocs_per_iter");
  splits.Report(state, {"truncate", "append", "allocate", "commit"});
  state.counters["recompute"] =
      benchmark::Counter(static_cast<double>(recompute), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TruncateCycle)->ArgName("pool")->Arg(1 << 10)->Arg(10 << 10)->Arg(100 << 10);

// ---- Scheduler steps ----------------------------------------------------------------------------
// Continuous batching in steady state: `running` requests decode one token each per step;
// `arrivals` of them finish (Free) and as many new ones arrive, each looked up in the prefix cache
// and prefilled in one chunk. Every prompt starts with the same `shared` tokens (a system prompt)
// and is new after them. Per scheduled request the engine reads what it needs to build its
// inputs: Step, the block table of every token group, the slot of every new token in every token
// group, and the state slots of every recurrent group.

struct StepShape {
  int32_t running = 0;            // requests decoding in steady state
  int32_t arrivals = 0;           // requests finishing, and as many arriving, per step
  int64_t prompt = 0;             // prompt tokens of every request
  int64_t shared = 0;             // leading prompt tokens common to every request
  int64_t decode_only_steps = 0;  // steps run after arrivals stop (BM_DecodeStep)
  // How the engine takes block tables each step: reading the last entry only (what changes in a
  // decode step; an engine can know that only by diffing), copying whole tables into the step's
  // input buffer, or applying TakeTableDelta to tables it keeps per request.
  enum class Tables { kLastEntry, kWhole, kDelta } tables = Tables::kLastEntry;
  // Tokens each request generates, so that exactly `arrivals` finish per step.
  int32_t output() const { return running / arrivals; }
};

constexpr int32_t kArrivalsPerStep = 4;
constexpr int64_t kDecodeOnlySteps = 1000;

// Blocks per pool for the running set plus a quarter more for cached prefixes: full-size tables
// for token groups at the longest context a request reaches (a window keeps fewer, but a prefill
// chunk holds all of its blocks until Commit), and for a state group the live state and a few
// checkpoints.
std::vector<int32_t> PoolsFor(const ManagerConfig& config, const StepShape& shape) {
  const int64_t peak = shape.prompt + shape.output() + 1 + shape.decode_only_steps;
  std::vector<int64_t> need(config.pool_blocks.size(), 0);
  for (const GroupConfig& g : config.groups) {
    int64_t per_request = 0;
    if (g.is_state()) {
      per_request = 4 + (config.checkpoint_interval > 0 ? peak / config.checkpoint_interval : 0);
    } else if (!g.is_encoder()) {
      per_request = (peak + g.block_tokens - 1) / g.block_tokens + 1;
    }
    need[static_cast<size_t>(g.pool)] += (shape.running + shape.arrivals) * per_request;
  }
  std::vector<int32_t> blocks;
  for (int64_t n : need)
    blocks.push_back(static_cast<int32_t>(std::min<int64_t>(1 + n + n / 4, INT32_MAX)));
  return blocks;
}

class SchedulerSim {
 public:
  static Result<std::unique_ptr<SchedulerSim>> Create(int model, const StepShape& shape) {
    HKV_ASSIGN_OR_RETURN(const ManagerConfig config, ModelConfig(model));
    HKV_ASSIGN_OR_RETURN(KvCacheManager m, MakeManager(model, PoolsFor(config, shape)));
    std::unique_ptr<SchedulerSim> sim(new SchedulerSim(std::move(m), shape));
    // Fill the batch (output() steps of arrivals), then let every slot turn over twice more so
    // that tables, request slots and the prefix cache reach their working sizes before anything
    // is timed or counted.
    for (int32_t i = 0; i < 3 * shape.output(); ++i)
      HKV_RETURN_IF_ERROR(sim->Step());
    return sim;
  }

  // Phases of a step, in the order they run.
  enum Phase : size_t { kDecodeAllocate, kArrive, kInputs, kOutput };
  static constexpr std::initializer_list<const char*> kPhaseNames = {"decode_alloc", "arrive",
                                                                     "inputs", "output"};

  Status Step() {
    phases_.Start();
    scheduled_.clear();
    for (std::vector<int64_t>& slots : slot_mapping_)
      slots.clear();

    // Schedule: a decode token for every running request, then the arrivals' prefills.
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i].left == 0) continue;
      HKV_RETURN_IF_ERROR(m_.Allocate(requests_[i].id, 1));
      scheduled_.push_back(i);
    }
    phases_.Lap(kDecodeAllocate);
    for (int32_t a = 0; a < arrivals_ && !idle_.empty(); ++a) {
      const size_t i = idle_.back();
      idle_.pop_back();
      HKV_RETURN_IF_ERROR(Arrive(requests_[i]));
      scheduled_.push_back(i);
    }
    phases_.Lap(kArrive);

    // Build the step's inputs.
    ends_.clear();
    for (size_t i : scheduled_) {
      const RequestId id = requests_[i].id;
      HKV_ASSIGN_OR_RETURN(const StepInfo info, m_.Step(id));
      ends_.push_back(info.end);
      sink_ += static_cast<int64_t>(info.copies.size());
      for (int32_t g : token_groups_) {
        HKV_RETURN_IF_ERROR(TakeTable(i, id, g));
        HKV_RETURN_IF_ERROR(
            m_.SlotMapping(id, g, info.begin, info.end, slot_mapping_[static_cast<size_t>(g)]));
      }
      for (int32_t g : state_groups_) {
        HKV_ASSIGN_OR_RETURN(const StateStep s, m_.State(id, g));
        sink_ += s.read + s.write + static_cast<int64_t>(s.snapshots.size());
      }
    }
    phases_.Lap(kInputs);

    // Take the step's output: commit, append the sampled token, free finished requests.
    for (size_t k = 0; k < scheduled_.size(); ++k) {
      Request& r = requests_[scheduled_[k]];
      HKV_RETURN_IF_ERROR(m_.Commit(r.id, ends_[k]));
      const int32_t sampled = TextToken(static_cast<int64_t>(r.id) + step_);
      HKV_RETURN_IF_ERROR(m_.AppendTokens(r.id, std::span<const int32_t>(&sampled, 1)));
      if (--r.left == 0) {
        HKV_RETURN_IF_ERROR(m_.Free(r.id));
        idle_.push_back(scheduled_[k]);
      }
    }
    phases_.Lap(kOutput);
    ++step_;
    return Status::Ok();
  }

  // From now on no request finishes and none arrives: every step is decodes only. Contexts then
  // grow by one token per step, so the caller bounds the steps (StepShape::decode_only_steps).
  void StopArrivals() {
    arrivals_ = 0;
    for (Request& r : requests_) {
      if (r.left > 0) r.left = INT32_MAX;
    }
  }

  const KvCacheManager& manager() const { return m_; }
  // Time spent per phase; assign Splits() to start counting afresh.
  Splits& phases() { return phases_; }
  int64_t sink() const { return sink_; }

 private:
  struct Request {
    RequestId id = 0;
    int32_t left = 0;  // tokens still to sample; 0: the slot is idle
  };

  SchedulerSim(KvCacheManager m, const StepShape& shape)
      : m_(std::move(m)),
        shape_(shape),
        arrivals_(shape.arrivals),
        prompt_(BasePrompt(shape.prompt)),
        requests_(static_cast<size_t>(shape.running)) {
    const auto running = static_cast<size_t>(shape.running);
    for (size_t i = running; i-- > 0;)
      idle_.push_back(i);
    scheduled_.reserve(running);
    ends_.reserve(running);
    kept_.assign(running, std::vector<std::vector<int32_t>>(m_.config().groups.size()));
    const ManagerConfig& config = m_.config();
    slot_mapping_.resize(config.groups.size());
    for (size_t g = 0; g < config.groups.size(); ++g) {
      const GroupConfig& group = config.groups[g];
      if (group.is_state()) {
        state_groups_.push_back(static_cast<int32_t>(g));
      } else if (!group.is_encoder() && group.rule.keeps_tokens()) {
        token_groups_.push_back(static_cast<int32_t>(g));
        slot_mapping_[g].reserve(running + static_cast<size_t>(shape.arrivals) * prompt_.size());
      }
    }
  }

  Status TakeTable(size_t slot, RequestId id, int32_t g) {
    switch (shape_.tables) {
      case StepShape::Tables::kLastEntry: {
        HKV_ASSIGN_OR_RETURN(const std::span<const int32_t> table, m_.BlockTable(id, g));
        if (!table.empty()) sink_ += table.back();
        return Status::Ok();
      }
      case StepShape::Tables::kWhole: {
        HKV_ASSIGN_OR_RETURN(const std::span<const int32_t> table, m_.BlockTable(id, g));
        std::vector<int32_t>& out = kept_[slot][static_cast<size_t>(g)];
        out.assign(table.begin(), table.end());
        sink_ += out.back();
        return Status::Ok();
      }
      case StepShape::Tables::kDelta: {
        HKV_ASSIGN_OR_RETURN(const TableDelta d, m_.TakeTableDelta(id, g));
        std::vector<int32_t>& out = kept_[slot][static_cast<size_t>(g)];
        out.resize(static_cast<size_t>(d.size));
        std::copy(d.blocks.begin(), d.blocks.end(), out.begin() + d.from);
        sink_ += out.back();
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  Status Arrive(Request& r) {
    r.id = next_id_++;
    r.left = shape_.output();
    Stamp(prompt_, shape_.shared, r.id);
    RequestSpec spec;
    spec.id = r.id;
    spec.prompt = prompt_;
    HKV_RETURN_IF_ERROR(m_.AddRequest(spec));
    HKV_ASSIGN_OR_RETURN(const PrefixHit hit, m_.Lookup(r.id));
    return m_.Allocate(r.id, shape_.prompt - hit.tokens, hit);
  }

  KvCacheManager m_;
  StepShape shape_;
  int32_t arrivals_;  // per step, until StopArrivals
  std::vector<int32_t> prompt_;
  std::vector<Request> requests_;
  std::vector<size_t> idle_;       // slots with no request, taken from the back
  std::vector<size_t> scheduled_;  // slots scheduled in this step, in order
  std::vector<int64_t> ends_;      // their step ends, for Commit
  std::vector<int32_t> token_groups_, state_groups_;
  std::vector<std::vector<int64_t>> slot_mapping_;  // per group: the step's slots, as sent to GPU
  // Per request slot and group: the block table as the engine holds it (Tables::kWhole, kDelta).
  std::vector<std::vector<std::vector<int32_t>>> kept_;
  RequestId next_id_ = 1;
  int64_t step_ = 0;
  int64_t sink_ = 0;  // what the engine read, so that no read is optimised away
  Splits phases_;
};

StepShape ShapeOf(const benchmark::State& state) {
  StepShape shape;
  shape.running = static_cast<int32_t>(state.range(1));
  shape.arrivals = kArrivalsPerStep;
  shape.prompt = state.range(2);
  shape.shared = shape.prompt / 2;
  return shape;
}

// Counters shared by the step benchmarks; `allocations` is the count before the timed loop.
void ReportStep(benchmark::State& state, SchedulerSim& sim, const StepShape& shape,
                int64_t allocations) {
  ReportAllocations(state, allocations, "allocs_per_step");
  sim.phases().Report(state, SchedulerSim::kPhaseNames);
  benchmark::DoNotOptimize(sim.sink());
  const KvCacheManager& m = sim.manager();
  const ManagerStats& stats = m.stats();
  state.counters["running"] = shape.running;
  // Time per running request's decode token: the step time over the batch.
  state.counters["per_request"] = benchmark::Counter(
      shape.running, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["hit_rate"] =
      stats.lookup_tokens == 0
          ? 0.0
          : static_cast<double>(stats.hit_tokens) / static_cast<double>(stats.lookup_tokens);
  double usage = 0;
  for (size_t p = 0; p < m.config().pool_blocks.size(); ++p)
    usage = std::max(usage, m.Usage(static_cast<int32_t>(p)).usage());
  state.counters["max_pool_usage"] = usage;
  state.SetLabel(kModels[static_cast<size_t>(state.range(0))].name);
  state.SetItemsProcessed(state.iterations());
}

// One mixed step per iteration: decodes, 4 finishing, 4 arriving, each prefilling the uncached
// half of its prompt as one chunk (Bamba the whole prompt: FromPlan sets no checkpoint interval,
// so no recurrent checkpoint lies at the shared prefix's end and its hit rate reads 0).
// The warmed-up simulation is kept between the calls Google Benchmark makes with growing
// iteration counts: it stays in steady state, and warming 1024 requests up again for every call
// would dominate the run.
void BM_SchedulerStep(benchmark::State& state) {
  const StepShape shape = ShapeOf(state);
  static std::unique_ptr<SchedulerSim> sim;
  static std::array<int64_t, 3> sim_args{};
  const std::array<int64_t, 3> args = {state.range(0), state.range(1), state.range(2)};
  if (!sim || sim_args != args) {
    sim.reset();
    Result<std::unique_ptr<SchedulerSim>> made =
        SchedulerSim::Create(static_cast<int>(state.range(0)), shape);
    if (!Check(state, made.status())) return;
    sim = std::move(made).value();
    sim_args = args;
  }
  sim->phases() = Splits();
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, sim->Step())) {
      sim.reset();
      return;
    }
  }
  ReportStep(state, *sim, shape, allocations);
}
BENCHMARK(BM_SchedulerStep)
    ->ArgNames({"model", "running", "prompt"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024}, {2048}})
    // Gemma-2 past its 4096-token window, so that decodes release blocks.
    ->Args({1, 256, 6144})
    ->Args({1, 1024, 6144})
    ->Unit(benchmark::kMicrosecond);

// Decode-only steps: the mixed steady state above, then no arrivals or finishes, so a step is
// exactly one decode token for each of `running` requests (contexts spread over prompt to prompt +
// output at the start, 1000 tokens longer at the end). Contexts grow, so the step count is fixed
// and the simulation built afresh; allocations here include tables and token lists growing past any
// size a recycled slot had.
void BM_DecodeStep(benchmark::State& state) {
  StepShape shape = ShapeOf(state);
  shape.decode_only_steps = kDecodeOnlySteps;
  Result<std::unique_ptr<SchedulerSim>> made =
      SchedulerSim::Create(static_cast<int>(state.range(0)), shape);
  if (!Check(state, made.status())) return;
  SchedulerSim& sim = **made;
  sim.StopArrivals();
  sim.phases() = Splits();
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, sim.Step())) return;
  }
  ReportStep(state, sim, shape, allocations);
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"model", "running", "prompt"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024}, {2048}})
    ->Iterations(kDecodeOnlySteps)
    ->Unit(benchmark::kMicrosecond);

// Decode-only steps at 1024 running requests as BM_DecodeStep, with the engine taking block
// tables whole (tables:1, copied into its input buffer every step) or as deltas (tables:2, only
// the entries that changed, into tables it keeps per request): what receiving only what changed
// saves per step. Gemma-2 at 6144-token prompts: its windows hold 256 blocks, the full-attention
// groups 390 and more.
void BM_DecodeTables(benchmark::State& state) {
  StepShape shape = ShapeOf(state);
  shape.decode_only_steps = kDecodeOnlySteps;
  shape.tables = static_cast<StepShape::Tables>(state.range(3));
  Result<std::unique_ptr<SchedulerSim>> made =
      SchedulerSim::Create(static_cast<int>(state.range(0)), shape);
  if (!Check(state, made.status())) return;
  SchedulerSim& sim = **made;
  sim.StopArrivals();
  sim.phases() = Splits();
  const int64_t allocations = Allocations();
  for (auto _ : state) {
    if (!Check(state, sim.Step())) return;
  }
  ReportStep(state, sim, shape, allocations);
}
BENCHMARK(BM_DecodeTables)
    ->ArgNames({"model", "running", "prompt", "tables"})
    ->ArgsProduct({{0, 1, 2}, {1024}, {2048}, {1, 2}})
    ->Args({1, 1024, 6144, 1})
    ->Args({1, 1024, 6144, 2})
    ->Iterations(kDecodeOnlySteps)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace hkv
