// ArenaUsage, PageMove, CompactionPlan: what two-level memory (SlabArena) reports and what a
// compaction does, as plain values the manager hands to engines without showing them the arena.
//
// Contract: a CompactionPlan's moves each take a held page of one class to a free page of the
// same class; its slabs are those the moves empty, each owned by the pool of its moves. Copying
// the bytes of every move (src to dst) is the caller's job.
#pragma once

#include <cstdint>
#include <vector>

namespace hkv {

struct ArenaClassUsage {
  int64_t slabs = 0;           // slabs the class owns
  int64_t held_pages = 0;      // pages in use
  int64_t free_pages = 0;      // owned pages not in use, cached or not
  int64_t cached_pages = 0;    // free pages that still hold a prefix identity
  int64_t empty_slabs = 0;     // owned slabs with no page in use (other classes may take them)
  int64_t stranded_pages = 0;  // free, uncached pages in slabs that have pages in use
};

struct ArenaUsage {
  int64_t num_slabs = 0;
  int64_t unassigned_slabs = 0;
  int64_t slabs_carved = 0;     // slabs given to a class from the unassigned ones, ever
  int64_t slabs_reclaimed = 0;  // slabs moved from one class to another, ever
  int64_t slabs_compacted = 0;  // slabs emptied by compaction and returned, ever
  int64_t pages_moved = 0;      // pages compaction moved, ever (held and cached)
  // Of them, free pages moved for what they cache (compaction that drops only older cache moves
  // the younger cached pages of the slabs it empties).
  int64_t cached_pages_moved = 0;
  std::vector<ArenaClassUsage> classes;
};

// A held page of class (pool) `pool` moving to a free page of the same class: its references and
// prefix identity go to `dst`, and its bytes must be copied from `src` to `dst`.
struct PageMove {
  int32_t pool = 0;
  int32_t src = 0;
  int32_t dst = 0;
};

// What Compact does: the moves, and the slabs they empty (each owned by the pool of its moves).
struct CompactionPlan {
  std::vector<PageMove> moves;
  std::vector<int32_t> slabs;

  void clear() {
    moves.clear();
    slabs.clear();
  }
};

}  // namespace hkv
