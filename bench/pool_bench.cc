// Pool-level costs that sit on the per-block path of every scheduler step.
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/pool/block_hash.h>

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

}  // namespace
}  // namespace hkv
