#include <hkv/manager/compaction_policy.h>

namespace hkv {

bool CompactionDue(const KvCacheManager& manager, bool refused, std::vector<int64_t>& limits,
                   int32_t& for_pool) {
  const ArenaConfig& arena = manager.config().arena;
  const size_t pools = manager.config().pool_blocks.size();
  limits.assign(pools, 0);
  for_pool = -1;
  if (!arena.enabled()) return false;
  // Whole slabs for anyone: unassigned ones, and owned ones without a held page (their free pages
  // beyond those inside held slabs). Only a class whose page is a whole slab can be kept out by
  // pages scattered over every slab.
  bool whole_slab_pages = false;
  // The class whose next page evicts a cached one: a state class, else a class mostly caching
  // (kCacheShareForSlabs of its pages free).
  int32_t evicting = -1;
  int32_t evicting_cache = -1;
  int64_t owned_slabs = 0, empty_slabs = 0;
  bool due = false;
  int64_t roomiest = -1;  // the class with the most slabs' worth free inside its held slabs
  double roomiest_slabs = 0;
  for (size_t c = 0; c < pools; ++c) {
    const PoolUsage u = manager.Usage(static_cast<int32_t>(c));
    const int32_t per = arena.pages_per_slab[c];
    whole_slab_pages = whole_slab_pages || per == 1;
    if (u.num_free > 0 && u.num_free == u.num_free_cached) {
      if (manager.config().pool_holds_states(static_cast<int32_t>(c))) {
        if (evicting < 0) evicting = static_cast<int32_t>(c);
      } else if (evicting_cache < 0 &&
                 u.num_free >= kCacheShareForSlabs * static_cast<double>(u.num_blocks)) {
        evicting_cache = static_cast<int32_t>(c);
      }
    }
    owned_slabs += u.num_blocks / per;
    empty_slabs += (u.num_free - u.num_free_in_held_slabs) / per;
    if (u.num_free_in_held_slabs < per) continue;
    if (refused) {
      limits[c] = arena.num_slabs;
      due = true;
    }
    const double slabs = static_cast<double>(u.num_free_in_held_slabs) / per;
    if (slabs > roomiest_slabs) {
      roomiest = static_cast<int64_t>(c);
      roomiest_slabs = slabs;
    }
  }
  const bool no_whole_slab = owned_slabs == arena.num_slabs && empty_slabs == 0;
  if (whole_slab_pages && no_whole_slab && roomiest >= 0) {
    limits[static_cast<size_t>(roomiest)] = arena.num_slabs;
    due = true;
  }
  if (evicting < 0) evicting = evicting_cache;
  if (due || evicting < 0 || owned_slabs < arena.num_slabs) return due;
  // Memory for the evicting class, in the age order: every other class with a slab's worth free
  // inside its held slabs gives up the slabs whose cache is older than the page that would be
  // evicted (KvCacheManager::CompactFor).
  for (size_t c = 0; c < pools; ++c) {
    const PoolUsage u = manager.Usage(static_cast<int32_t>(c));
    if (static_cast<int32_t>(c) == evicting) continue;
    if (u.num_free_in_held_slabs < arena.pages_per_slab[c]) continue;
    limits[c] = arena.num_slabs;
    due = true;
  }
  if (due) for_pool = evicting;
  return due;
}

}  // namespace hkv
