// CompactionDue: when a driver of a KvCacheManager with two-level memory should call Compact
// between steps, and on which page classes. The reference engine and the simulator both follow
// it, so that what `hkv simulate` reports is what an engine using the manager gets.
//
// Contract: fills `limits` with one entry per pool (0: leave the class alone; otherwise the
// arena's slab count, a full compaction of the class) and returns whether any class is due. Only
// a class with a slab's worth of pages free inside slabs that still hold its pages can be due:
// - every such class, after an allocation was refused since the last compaction (`refused`):
//   losing the cache of the emptied slabs is cheaper than preempting a request;
// - the roomiest such class, when some class's page is a whole slab (a recurrent state, 59 MiB
//   for Bamba) and no slab is whole for anyone (none unassigned, no class with an empty one):
//   attention pages scattered over every slab would keep states out, and the cached pages the
//   emptied slabs drop are worth less than the states they make room for (docs/manager.md,
//   "Compaction policy", measures it).
// - otherwise, when a class of recurrent states would evict one of its cached pages for its next
//   page (all its free pages cache something) and no slab is unassigned: every other class
//   with a slab's worth free inside its held slabs, with `for_pool` set to that class. The driver
//   then calls KvCacheManager::CompactFor(for_pool, limits), which drops only cache older than the
//   page that would be evicted (moving the younger cached pages of the slabs it empties with
//   their held ones) and gives the emptied slabs to it (for_pool is -1 otherwise, and the driver
//   calls Compact(limits)).
// - the same for another class (attention pages) that would evict a cached page while at least
//   kCacheShareForSlabs of its pages are free: memory it mostly spends on cache, not on running
//   requests. CompactFor then drops only cache KvCacheManager::kCacheAgeMargin times as old as
//   the token page it spares. Without this rule, slabs a class of states holds after a peak of
//   running requests (one live state each, scattered over its slabs) stay its own for good,
//   caching states whose attention prefixes the token class had to evict; with a class mostly
//   held (an overload), taking slabs from the states only makes them take slabs back
//   (docs/manager.md, "Younger cache moves with its slab", measures it).
// Stranded pages alone are no reason: their class reuses them before it takes a slab, and
// emptying slabs for them drops cached pages (on Jamba, whose 4 states share a slab, the
// checkpoints). Without two-level memory nothing is ever due. Reads only; O(pools) calls of
// KvCacheManager::Usage.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/manager/kv_cache_manager.h>

namespace hkv {

// The share of its pages a class other than recurrent states must have free (all cached) before
// it takes slabs from other classes for its cache.
inline constexpr double kCacheShareForSlabs = 0.4;

bool CompactionDue(const KvCacheManager& manager, bool refused, std::vector<int64_t>& limits,
                   int32_t& for_pool);

}  // namespace hkv
