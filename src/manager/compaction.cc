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
  Result<CompactionResult> out = impl_->Compact(max_slabs_per_class);
  impl_->core.SettleDrops();  // the emptied slabs' cached pages are gone
  return out;
}

Result<CompactionResult> KvCacheManager::Impl::Compact(std::span<const int64_t> max_slabs) {
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
  for (size_t p = 0; p < pools.size(); ++p) {
    if (max_slabs[p] == 0) continue;
    Must(arena.PlanCompaction(pools, static_cast<int32_t>(p), max_slabs[p], compaction));
  }
  if (compaction.slabs.empty()) return out;
  Must(arena.Compact(pools, compaction));

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
