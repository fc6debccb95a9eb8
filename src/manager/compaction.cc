// Compact: empties sparsely held slabs of two-level memory by moving their pages, then rewrites
// every reference the requests hold to a moved page.
#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Result<CompactionResult> KvCacheManager::Compact(int64_t max_slabs_per_class) {
  return impl_->Compact(max_slabs_per_class);
}

Result<CompactionResult> KvCacheManager::Impl::Compact(int64_t max_slabs) {
  if (max_slabs < 1) {
    return Status::InvalidArgument(
        fmt::format("compact: at most {} slabs per class; expected >= 1", max_slabs));
  }
  // An open step has handed out block ids the engine is about to use: moving them under it
  // would make it write pages the manager no longer gives that request.
  for (size_t slot = 0; slot < requests.size(); ++slot) {
    const Request& r = requests[slot];
    if (index.Find(r.id) != static_cast<int32_t>(slot) || !r.step_open) continue;
    return Status::FailedPrecondition(
        fmt::format("compact: request {} has an open step [{}, {}); commit every step first", r.id,
                    r.step_begin, r.step_end));
  }
  CompactionResult out;
  if (arena.num_slabs() == 0) return out;
  compaction.clear();
  for (size_t p = 0; p < pools.size(); ++p) {
    Must(arena.PlanCompaction(pools, static_cast<int32_t>(p), max_slabs, compaction));
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
    Request& r = requests[slot];
    if (index.Find(r.id) != static_cast<int32_t>(slot)) continue;
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const std::vector<int32_t>& to = moved_to[static_cast<size_t>(config.groups[gi].pool)];
      const auto remap = [&](int32_t& b) {
        if (b != BlockPool::kNullBlock && to[static_cast<size_t>(b)] != BlockPool::kNullBlock) {
          b = to[static_cast<size_t>(b)];
        }
      };
      GroupState& gs = r.groups[gi];
      for (int32_t& b : gs.table)
        remap(b);
      remap(gs.live);
      remap(gs.rolling.block);
      for (HeldState& h : gs.held)
        remap(h.block);
    }
  }
  for (const PageMove& m : compaction.moves) {
    moved_to[static_cast<size_t>(m.pool)][static_cast<size_t>(m.src)] = BlockPool::kNullBlock;
  }
  out.moves = compaction.moves;
  out.slabs = compaction.slabs;
  return out;
}

}  // namespace hkv
