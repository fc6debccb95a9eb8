// Pool-level costs that sit on the per-block path of every scheduler step.
#include <algorithm>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/common/splitmix64.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/block_pool.h>
#include <hkv/pool/slab_arena.h>

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

// Two-level memory against fixed pools, side by side: a request's step takes 16 attention pages
// and one state page, publishes them (so freed pages stay cached and later allocations evict),
// and gives them back tail first. Fixed: two BlockPools and the manager's per-pool free-count
// check. Two-level: the same pages from a SlabArena of Bamba-9B's shape (a slab is one 59 MiB
// state or 316 attention pages; 275 slabs), Reserve then Allocate. Half of memory is held by
// other requests throughout, so the arena's pools are partly carved and partly cached.
// Argument 1: pages are published (the prefix index on the path, evictions from the cache);
// 0: plain allocation and release, nothing cached.
struct Step {
  std::vector<int32_t> attn, state;
  uint64_t key = 0;
  bool publish = true;
};

// Keys as random as real chain digests.
void Publish(BlockPool& pool, const std::vector<int32_t>& blocks, uint64_t& key) {
  for (int32_t b : blocks) {
    SplitMix64 mix(++key);
    const uint64_t lo = mix.Next();
    (void)pool.Publish(b, PrefixKey{{lo, mix.Next()}, 0});
  }
}

void RunStep(std::vector<BlockPool>& pools, SlabArena* arena, Step& s) {
  const std::vector<int64_t> need = {16, 1};
  if (arena != nullptr) {
    if (!arena->Reserve(pools, need).ok()) std::abort();
  } else if (pools[0].num_free() < 16 || pools[1].num_free() < 1) {
    std::abort();
  }
  s.attn.clear();
  s.state.clear();
  (void)pools[0].Allocate(16, s.attn);
  (void)pools[1].Allocate(1, s.state);
  if (s.publish) {
    Publish(pools[0], s.attn, s.key);
    Publish(pools[1], s.state, s.key);
  }
  std::reverse(s.attn.begin(), s.attn.end());
  (void)pools[0].Free(s.attn);
  (void)pools[1].Free(s.state);
}

void BM_StepFixedPools(benchmark::State& state) {
  std::vector<BlockPool> pools;
  pools.push_back(BlockPool::Create(275 * 316 / 2 + 1, false).value());
  pools.push_back(BlockPool::Create(275 / 2 + 1, false).value());
  std::vector<int32_t> held_a, held_s;
  (void)pools[0].Allocate(pools[0].num_free() / 2, held_a);
  (void)pools[1].Allocate(pools[1].num_free() / 2, held_s);
  Step s;
  s.publish = state.range(0) != 0;
  for (auto _ : state)
    RunStep(pools, nullptr, s);
  state.SetItemsProcessed(state.iterations() * 17);
}
BENCHMARK(BM_StepFixedPools)->Arg(1)->Arg(0);

void BM_StepTwoLevel(benchmark::State& state) {
  const std::vector<int32_t> per = {316, 1};
  SlabArena arena = SlabArena::Create(275, per).value();
  std::vector<BlockPool> pools = arena.MakePools(false).value();
  std::vector<int64_t> half = {275 * 316 / 4, 275 / 4};
  (void)arena.Reserve(pools, half);
  std::vector<int32_t> held_a, held_s;
  (void)pools[0].Allocate(static_cast<int32_t>(half[0]), held_a);
  (void)pools[1].Allocate(static_cast<int32_t>(half[1]), held_s);
  Step s;
  s.publish = state.range(0) != 0;
  for (auto _ : state)
    RunStep(pools, &arena, s);
  state.SetItemsProcessed(state.iterations() * 17);
}
BENCHMARK(BM_StepTwoLevel)->Arg(1)->Arg(0);

// Demand swinging between classes every step: a slab's worth of attention pages, then as many
// states as fit in that slab; every step moves a slab (carving or taking it from the other
// class, dropping its cached pages). The price of memory that follows demand.
void BM_StepSlabMoves(benchmark::State& state) {
  const std::vector<int32_t> per = {316, 1};
  SlabArena arena = SlabArena::Create(4, per).value();
  std::vector<BlockPool> pools = arena.MakePools(false).value();
  std::vector<int32_t> blocks;
  uint64_t key = 0;
  size_t p = 0;
  for (auto _ : state) {
    std::vector<int64_t> need = {0, 0};
    need[p] = 3 * per[p];
    if (!arena.Reserve(pools, need).ok()) std::abort();
    blocks.clear();
    (void)pools[p].Allocate(static_cast<int32_t>(need[p]), blocks);
    Publish(pools[p], blocks, key);
    (void)pools[p].Free(blocks);
    p = 1 - p;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_StepSlabMoves);

// Compacting one slab, beside BM_StepTwoLevel's allocation (same Bamba-9B shape; items are
// pages, so items/s compare a page moved with a page allocated). Half of memory is full slabs of
// attention pages and a few of states; one slab holds range(0) attention pages and another has
// that many free: each iteration plans (PlanCompaction, one slab) and performs the moves
// (Compact). Untimed, the moved pages are freed and the returned slab carved and filled again,
// which restores the same layout.
void BM_CompactOneSlab(benchmark::State& state) {
  const std::vector<int32_t> per = {316, 1};
  const auto held = static_cast<int32_t>(state.range(0));
  SlabArena arena = SlabArena::Create(275, per).value();
  std::vector<BlockPool> pools = arena.MakePools(false).value();
  std::vector<int32_t> background, states, partial, victim;
  if (!arena.Reserve(pools, std::vector<int64_t>{137 * 316, 0}).ok()) std::abort();
  (void)pools[0].Allocate(137 * 316, background);
  if (!arena.Reserve(pools, std::vector<int64_t>{0, 40}).ok()) std::abort();
  (void)pools[1].Allocate(40, states);
  // The receiving slab: full but for `held` pages. Then the victim: `held` pages of a fresh slab.
  if (!arena.Reserve(pools, std::vector<int64_t>{316, 0}).ok()) std::abort();
  (void)pools[0].Allocate(316 - held, partial);
  const auto refill = [&] {
    const int64_t free_pages = pools[0].num_free();
    if (!arena.Reserve(pools, std::vector<int64_t>{free_pages + 1, 0}).ok()) std::abort();
    victim.clear();
    (void)pools[0].Allocate(held, victim);  // the new slab's pages are first in line
  };
  refill();
  CompactionPlan plan;
  int64_t moves = 0;
  for (auto _ : state) {
    plan.clear();
    if (!arena.PlanCompaction(pools, 0, 1, plan).ok() || plan.slabs.size() != 1) std::abort();
    if (!arena.Compact(pools, plan).ok()) std::abort();
    moves += static_cast<int64_t>(plan.moves.size());
    state.PauseTiming();
    victim.clear();
    for (const PageMove& m : plan.moves)
      victim.push_back(m.dst);
    (void)pools[0].Free(victim, Retention::kLow);
    refill();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(moves);
}
BENCHMARK(BM_CompactOneSlab)->Arg(158)->Arg(16);

}  // namespace
}  // namespace hkv
