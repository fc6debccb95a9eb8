// Pool-level costs that sit on the per-block path of every scheduler step.
#include <algorithm>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/pool/block_hash.h>
#include <hkv/pool/block_pool.h>

namespace hkv {
namespace {

// One block's prefix digest, for the block sizes engines use.
void BM_HashBlock(benchmark::State& state) {
  std::vector<int32_t> tokens(static_cast<size_t>(state.range(0)));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>(i * 7919 % 32000);
  BlockHash parent = kRootHash;
  for (auto _ : state) {
    parent = HashBlock(parent, tokens);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_HashBlock)->Arg(16)->Arg(64)->Arg(256);

// A request's worth of blocks taken and given back, at pool sizes from 1k to 100k blocks: the
// cost must not grow with the pool.
void BM_AllocateFree16(benchmark::State& state) {
  BlockPool pool = BlockPool::Create(static_cast<int32_t>(state.range(0)), false).value();
  std::vector<int32_t> blocks;
  blocks.reserve(16);
  for (auto _ : state) {
    blocks.clear();
    (void)pool.Allocate(16, blocks);
    std::reverse(blocks.begin(), blocks.end());  // tail first, as a finished request frees
    (void)pool.Free(blocks);
  }
  state.SetItemsProcessed(state.iterations() * 16);
}
BENCHMARK(BM_AllocateFree16)->Arg(1 << 10)->Arg(10 << 10)->Arg(100 << 10);

// Prefix lookups with the index filled to one identity per block.
void BM_FindHit(benchmark::State& state) {
  const auto n = static_cast<int32_t>(state.range(0));
  BlockPool pool = BlockPool::Create(n, false).value();
  std::vector<int32_t> blocks;
  (void)pool.Allocate(n - 1, blocks);
  std::vector<PrefixKey> keys;
  BlockHash h = kRootHash;
  const std::vector<int32_t> tokens(16, 5);
  for (int32_t b : blocks) {
    h = HashBlock(h, tokens);
    keys.push_back({h, 0});
    (void)pool.Publish(b, keys.back());
  }
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool.Find(keys[i]));
    i = i + 1 == keys.size() ? 0 : i + 1;
  }
}
BENCHMARK(BM_FindHit)->Arg(1 << 10)->Arg(10 << 10)->Arg(100 << 10);

}  // namespace
}  // namespace hkv
