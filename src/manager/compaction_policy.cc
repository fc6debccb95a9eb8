#include <hkv/manager/compaction_policy.h>

namespace hkv {

bool CompactionDue(const KvCacheManager& manager, bool refused, std::vector<int64_t>& limits) {
  const ArenaConfig& arena = manager.config().arena;
  limits.assign(manager.config().pool_blocks.size(), 0);
  if (!arena.enabled()) return false;
  // Only a class whose page is a whole slab can be kept out by pages scattered over every slab.
  bool whole_slab_pages = false;
  for (int32_t per : arena.pages_per_slab)
    whole_slab_pages = whole_slab_pages || per == 1;
  bool no_whole_slab = false;
  if (whole_slab_pages) {
    const ArenaUsage usage = manager.Arena();
    no_whole_slab = usage.unassigned_slabs == 0;
    for (const ArenaClassUsage& c : usage.classes)
      no_whole_slab = no_whole_slab && c.empty_slabs == 0;
  }
  bool due = false;
  int64_t roomiest = -1;  // the class with the most slabs' worth free inside its held slabs
  double roomiest_slabs = 0;
  for (size_t c = 0; c < limits.size(); ++c) {
    const PoolUsage u = manager.Usage(static_cast<int32_t>(c));
    const int32_t per = arena.pages_per_slab[c];
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
  if (no_whole_slab && roomiest >= 0) {
    limits[static_cast<size_t>(roomiest)] = arena.num_slabs;
    due = true;
  }
  return due;
}

}  // namespace hkv
