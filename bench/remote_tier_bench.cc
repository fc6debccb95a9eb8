// Remote tier throughput: Put and Get of block-sized entries through a real redis-server on
// loopback (started by the benchmark), side by side with the host tier in the same run. Sizes are
// one block of a real model's group (a Llama-3.1-8B 16-token block of all 32 layers is 2 MiB in
// bf16; a Mamba-2 state of Bamba-9B's 58 layers is ~2.3 MiB) and smaller ones. Batches: PutMany and
// ContainsMany pipelined against one round trip per entry, and the reference engine's round trips
// per step with the connector's batching on and off.
#include <cstdio>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/connector/host_tier.h>
#include <hkv/connector/remote_tier.h>
#include <hkv/engine/verify.h>
#include <hkv/spec/config_loader.h>

#include "../tests/connector/redis_server.h"

namespace hkv {
namespace {

PrefixKey Key(uint64_t i) {
  return PrefixKey{BlockHash{i * 0x9E3779B97F4A7C15ull, i}, static_cast<int32_t>(i % 4)};
}

std::unique_ptr<Tier> MakeTier(bool remote, int64_t capacity) {
  if (!remote) return std::make_unique<HostTier>(capacity);
  auto t = RemoteTier::Connect(
      testing::SharedRedisServer().Options(testing::FreshNamespace("bench"), capacity));
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::abort();
  }
  return std::move(t).value();
}

// Put of a new block each iteration; the tier's budget (64 entries) evicts the oldest, so the
// server's memory stays bounded.
void BM_Put(benchmark::State& state) {
  const bool remote = state.range(0) == 1;
  const auto bytes = static_cast<size_t>(state.range(1));
  auto tier = MakeTier(remote, static_cast<int64_t>(bytes) * 64);
  const std::vector<unsigned char> block(bytes, 0x5a);
  uint64_t i = 0;
  for (auto _ : state) {
    const Status s = tier->Put(Key(++i), block);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(1));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetLabel(remote ? "remote" : "host");
}

// Get of one of 32 stored blocks, round robin (each checked against its checksum when remote).
void BM_Get(benchmark::State& state) {
  const bool remote = state.range(0) == 1;
  const auto bytes = static_cast<size_t>(state.range(1));
  auto tier = MakeTier(remote, static_cast<int64_t>(bytes) * 64);
  const std::vector<unsigned char> block(bytes, 0xa5);
  for (uint64_t k = 0; k < 32; ++k) {
    if (!tier->Put(Key(k), block).ok()) state.SkipWithError("put failed");
  }
  uint64_t i = 0;
  for (auto _ : state) {
    auto got = tier->Get(Key(i++ % 32));
    if (!got.ok()) state.SkipWithError(got.status().ToString().c_str());
    benchmark::DoNotOptimize(got);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(1));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetLabel(remote ? "remote" : "host");
}

// Contains of a key the server holds (another process's entry: a round trip every time).
void BM_ContainsShared(benchmark::State& state) {
  const bool remote = state.range(0) == 1;
  auto writer = MakeTier(remote, int64_t{1} << 20);
  if (!writer->Put(Key(1), std::vector<unsigned char>(64, 1)).ok()) state.SkipWithError("put");
  for (auto _ : state)
    benchmark::DoNotOptimize(writer->Contains(Key(2)));
  state.SetLabel(remote ? "remote (EXISTS)" : "host");
}

// A batch of 32 entries per iteration through PutMany (pipelined, or one round trip per entry),
// new keys each time; range(0): pipeline, range(1): entry bytes.
void BM_PutMany(benchmark::State& state) {
  const bool pipeline = state.range(0) == 1;
  const auto bytes = static_cast<size_t>(state.range(1));
  RemoteTierOptions o =
      testing::SharedRedisServer().Options(testing::FreshNamespace("bench-many"), int64_t{1} << 40);
  o.pipeline = pipeline;
  o.ownership = RemoteTierOptions::Ownership::kTier;
  o.capacity_bytes = static_cast<int64_t>(bytes) * 96;  // bounds the server's memory
  auto tier = RemoteTier::Connect(o).value();
  const std::vector<unsigned char> block(bytes, 0x5a);
  std::vector<PrefixKey> keys(32);
  const std::vector<std::span<const unsigned char>> values(32, block);
  std::vector<Status> out(32);
  uint64_t next = 0;
  for (auto _ : state) {
    for (PrefixKey& k : keys)
      k = Key(++next);
    tier->PutMany(keys, values, out);
    for (const Status& st : out)
      if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 32 * state.range(1));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 32);
  state.counters["round_trips_per_batch"] = benchmark::Counter(
      static_cast<double>(tier->round_trips()) / static_cast<double>(state.iterations()));
  state.SetLabel(pipeline ? "pipelined" : "one round trip per entry");
}

// ContainsMany of 64 keys another process stored (none in this tier's index).
void BM_ContainsMany(benchmark::State& state) {
  const bool pipeline = state.range(0) == 1;
  const std::string ns = testing::FreshNamespace("bench-contains");
  auto writer = RemoteTier::Connect(testing::SharedRedisServer().Options(ns)).value();
  RemoteTierOptions o = testing::SharedRedisServer().Options(ns);
  o.pipeline = pipeline;
  auto reader = RemoteTier::Connect(o).value();
  std::vector<PrefixKey> keys;
  for (uint64_t k = 0; k < 64; ++k) {
    keys.push_back(Key(k));
    if (k % 2 == 0 && !writer->Put(Key(k), std::vector<unsigned char>(64, 1)).ok()) {
      state.SkipWithError("put");
    }
  }
  std::vector<unsigned char> out(64);
  for (auto _ : state) {
    reader->ContainsMany(keys, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 64);
  state.SetLabel(pipeline ? "pipelined" : "one EXISTS per key");
}

// The reference engine over a Redis tier: 32 Bamba requests, then a fresh engine reloading them
// (hkv verify's workload). Counters: the tier's round trips per engine step, batched or not.
void BM_EngineRoundTrips(benchmark::State& state) {
  const bool pipeline = state.range(0) == 1;
  const ModelSpec model =
      LoadModelConfig(std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B/config.json")
          .value();
  double trips = 0, steps = 0, loads = 0;
  for (auto _ : state) {
    RemoteTierOptions o = testing::SharedRedisServer().Options(testing::FreshNamespace("engine"));
    o.pipeline = pipeline;
    VerifyOptions v;
    v.requests = 32;
    v.seed = 3;
    o.model = VerifyModelIdentity(model, v).value();
    auto tier = RemoteTier::Connect(o).value();
    v.offload = OffloadOptions{{tier.get()}};
    v.restarts = 1;
    const VerifyReport r = RunVerify(model, v).value();
    if (r.mismatches != 0) state.SkipWithError("mismatch");
    trips += static_cast<double>(tier->round_trips());
    steps += static_cast<double>(r.steps);
    loads += static_cast<double>(r.loads_completed);
  }
  state.counters["round_trips_per_step"] = benchmark::Counter(trips / steps);
  state.counters["steps"] = benchmark::Counter(steps / static_cast<double>(state.iterations()));
  state.counters["loads"] = benchmark::Counter(loads / static_cast<double>(state.iterations()));
  state.SetLabel(pipeline ? "batched" : "one round trip per block");
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t remote : {0, 1}) {
    for (int64_t size : {int64_t{64} << 10, int64_t{512} << 10, int64_t{2} << 20})
      b->Args({remote, size});
  }
}

BENCHMARK(BM_Put)->Apply(Sizes)->UseRealTime();
BENCHMARK(BM_Get)->Apply(Sizes)->UseRealTime();
BENCHMARK(BM_ContainsShared)->Arg(0)->Arg(1)->UseRealTime();
BENCHMARK(BM_PutMany)
    ->ArgsProduct({{0, 1}, {4 << 10, 64 << 10, 512 << 10, 2 << 20}})
    ->UseRealTime();
BENCHMARK(BM_ContainsMany)->Arg(0)->Arg(1)->UseRealTime();
BENCHMARK(BM_EngineRoundTrips)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace hkv
