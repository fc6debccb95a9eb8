// Compact: empties sparsely held slabs of two-level memory by moving their pages, then rewrites
// every reference the requests hold to a moved page.
#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Result<CompactionResult> KvCacheManager::Compact(int64_t max_slabs_per_class) {
  if (max_slabs_per_class < 1) {
    return Status::InvalidArgument(
        fmt::format("compact: max_slabs_per_class {}; expected >= 1", max_slabs_per_class));
  }
  const std::vector<int64_t> limits(impl_->core.pools.size(), max_slabs_per_class);
  return Compact(limits);
}

Result<CompactionResult> KvCacheManager::Compact(std::span<const int64_t> max_slabs_per_class) {
  impl_->ForgetFreeSteps();  // pages move under the requests' tables
  Result<CompactionResult> out = impl_->Compact(max_slabs_per_class);
  impl_->core.SettleDrops();  // the emptied slabs' cached pages are gone
  return out;
}

Result<CompactionResult> KvCacheManager::CompactFor(int32_t pool,
                                                    std::span<const int64_t> max_slabs_per_class) {
  if (pool < 0 || static_cast<size_t>(pool) >= impl_->core.pools.size()) {
    return Status::InvalidArgument(
        fmt::format("compact for class {}: expected 0 to {}", pool, impl_->core.pools.size() - 1));
  }
  impl_->ForgetFreeSteps();
  Result<CompactionResult> out = impl_->Compact(max_slabs_per_class, pool);
  impl_->core.SettleDrops();
  return out;
}

namespace {

// The tick of the cached page class `bp` would evict for its next page; 0 when it would evict
// none (an uncached free page comes first, or it has no free page) or only a demoted one.
uint64_t NextVictimTick(const BlockPool& bp) {
  const int32_t head = bp.NextFree(-1);
  if (head < 0 || !bp.has_identity(head)) return 0;
  return bp.free_tick(head);
}

}  // namespace

Result<CompactionResult> KvCacheManager::Impl::Compact(std::span<const int64_t> max_slabs,
                                                       int32_t for_pool) {
  if (max_slabs.size() != core.pools.size()) {
    return Status::InvalidArgument(fmt::format("compact: {} per-class limits for {} pools",
                                               max_slabs.size(), core.pools.size()));
  }
  for (size_t p = 0; p < max_slabs.size(); ++p) {
    if (max_slabs[p] < 0) {
      return Status::InvalidArgument(
          fmt::format("compact: class {} limit {}; expected >= 0", p, max_slabs[p]));
    }
  }
  // An open step has handed out block ids the engine is about to use: moving them under it
  // would make it write pages the manager no longer gives that request.
  for (size_t slot = 0; slot < requests.size(); ++slot) {
    const Request& r = requests[slot];
    if (!Live(slot) || !r.step_open) continue;
    return Status::FailedPrecondition(
        fmt::format("compact: request {} has an open step [{}, {}); commit every step first", r.id,
                    r.step_begin, r.step_end));
  }
  CompactionResult out;
  SlabArena& arena = core.arena;
  std::vector<BlockPool>& pools = core.pools;
  if (arena.num_slabs() == 0) return out;
  compaction.clear();
  uint64_t older_than = UINT64_MAX;
  if (for_pool >= 0) {
    older_than = NextVictimTick(pools[static_cast<size_t>(for_pool)]);
    if (older_than == 0) return out;
    if (!core.arena.is_state_class(static_cast<size_t>(for_pool))) {
      // Token cache takes slabs only from cache kCacheAgeMargin times as old as its victim.
      const uint64_t clock = pools[static_cast<size_t>(for_pool)].clock();
      const uint64_t age = clock - older_than;
      if (age > (clock - 1) / KvCacheManager::kCacheAgeMargin) return out;  // margin * age >= clock
      older_than = clock - KvCacheManager::kCacheAgeMargin * age;
    }
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    if (max_slabs[p] == 0 || static_cast<int32_t>(p) == for_pool) continue;
    Must(
        arena.PlanCompaction(pools, static_cast<int32_t>(p), max_slabs[p], compaction, older_than));
  }
  if (compaction.slabs.empty()) return out;
  Must(arena.Compact(pools, compaction, for_pool));

  if (moved_to.empty()) {
    for (const BlockPool& bp : pools)
      moved_to.emplace_back(static_cast<size_t>(bp.num_blocks()), BlockPool::kNullBlock);
  }
  for (const PageMove& m : compaction.moves) {
    moved_to[static_cast<size_t>(m.pool)][static_cast<size_t>(m.src)] = m.dst;
  }
  // A block shared by several requests (forks, prefix hits) or named twice by one (live and
  // rolling state) is rewritten wherever it appears; the reference counts moved with it.
  for (size_t slot = 0; slot < requests.size(); ++slot) {
    if (!Live(slot)) continue;
    for (const auto& g : groups)
      g->Remap(static_cast<int32_t>(slot), moved_to[static_cast<size_t>(g->pool())]);
  }
  for (const PageMove& m : compaction.moves) {
    moved_to[static_cast<size_t>(m.pool)][static_cast<size_t>(m.src)] = BlockPool::kNullBlock;
  }
  return std::move(compaction);  // rare: the scratch's capacity is not worth a copy
}

}  // namespace hkv
