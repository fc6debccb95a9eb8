// Remote tier throughput: Put and Get of block-sized entries through a real redis-server on
// loopback (started by the benchmark), side by side with the host tier in the same run. Sizes are
// one block of a real model's group (a Llama-3.1-8B 16-token block of all 32 layers is 2 MiB in
// bf16; a Mamba-2 state of Bamba-9B's 58 layers is ~2.3 MiB) and smaller ones.
#include <cstdio>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/connector/host_tier.h>
#include <hkv/connector/remote_tier.h>

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

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t remote : {0, 1}) {
    for (int64_t size : {int64_t{64} << 10, int64_t{512} << 10, int64_t{2} << 20})
      b->Args({remote, size});
  }
}

BENCHMARK(BM_Put)->Apply(Sizes)->UseRealTime();
BENCHMARK(BM_Get)->Apply(Sizes)->UseRealTime();
BENCHMARK(BM_ContainsShared)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace hkv
