// SlabArena: the upper level of two-level memory. One budget of `num_slabs` equal slabs (large
// pages) is shared by several page classes; a slab given to a class is carved into
// pages_per_slab(class) pages of that class (its BlockPool's segment of the same index), and
// memory moves between classes one slab at a time, as they need it.
//
// Contract:
// - The arena keeps the slab level; the pools it made (MakePools) keep the page level. Calls take
//   those pools back as a span, in the same order; each slab is unassigned or owned by exactly
//   one pool.
// - A slab whose pages are all free is shared memory again: any class may take it when it needs
//   pages. One caching nothing is taken as if unassigned; one still caching pages keeps serving
//   hits to its class until another class takes it, oldest-emptied first, and the identities it
//   held are then dropped (`removed` events of its pool).
// - Reserve(need) makes every pool p able to Allocate need[p] pages at once, or fails with
//   kResourceExhausted having changed nothing. It moves slabs only: first unassigned slabs, then
//   empty slabs of classes that can spare them (a class never drops below its own need). Among
//   the pages a class would otherwise take by evicting its own cached pages, it takes a slab
//   instead when there is an unassigned or uncaching one, or when another class's empty slab
//   became empty before the page it would evict was freed: eviction follows one age order
//   across classes.
// - Stranded pages are free pages that cache nothing inside slabs that still hold pages of
//   their class: no other class can use them. Usage() measures them; a class takes a new slab
//   only when it has no such page left, so they never exceed what its own frees left behind.
// Reserve allocates nothing; it is linear in the pages reserved.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/block_pool.h>

namespace hkv {

struct ArenaClassUsage {
  int64_t slabs = 0;           // slabs the class owns
  int64_t held_pages = 0;      // pages in use
  int64_t free_pages = 0;      // owned pages not in use, cached or not
  int64_t cached_pages = 0;    // free pages that still hold a prefix identity
  int64_t empty_slabs = 0;     // owned slabs with no page in use (other classes may take them)
  int64_t stranded_pages = 0;  // free, uncached pages in slabs that have pages in use
};

// A block of one of the arena's pools.
struct PoolBlock {
  int32_t pool = 0;
  int32_t block = 0;
};

struct ArenaUsage {
  int64_t num_slabs = 0;
  int64_t unassigned_slabs = 0;
  int64_t slabs_carved = 0;     // slabs given to a class from the unassigned ones, ever
  int64_t slabs_reclaimed = 0;  // slabs moved from one class to another, ever
  std::vector<ArenaClassUsage> classes;
};

class SlabArena {
 public:
  SlabArena() = default;
  // num_slabs slabs; pages_per_slab[p] pages of class p fit in one slab (each >= 1).
  static Result<SlabArena> Create(int64_t num_slabs, std::span<const int32_t> pages_per_slab);
  // One segmented pool per class (block ids 1 + slab * pages_per_slab + page), sharing one
  // eviction clock, owning nothing yet.
  Result<std::vector<BlockPool>> MakePools(bool record_events) const;

  // `keep` lists free blocks the caller is about to acquire (prefix hits): their slabs are not
  // given away.
  Status Reserve(std::span<BlockPool> pools, std::span<const int64_t> need,
                 std::span<const PoolBlock> keep = {});

  int64_t num_slabs() const { return static_cast<int64_t>(owner_.size()); }
  int64_t num_unassigned() const { return static_cast<int64_t>(unassigned_.size()); }
  int32_t pages_per_slab(size_t p) const { return pages_per_slab_[p]; }
  int32_t owner(int64_t slab) const { return owner_[static_cast<size_t>(slab)]; }  // -1: none

  ArenaUsage Usage(std::span<const BlockPool> pools) const;
  // Every slab has one owner or none, the pools own exactly the slabs the arena says, and every
  // pool's own invariants hold.
  Status CheckInvariants(std::span<const BlockPool> pools) const;

 private:
  // Largest number of slabs pool q can give up and still allocate need_q pages.
  int64_t Spare(std::span<const BlockPool> pools, size_t q, int64_t need_q) const;
  Status ReserveKeeping(std::span<BlockPool> pools, std::span<const int64_t> need);
  // Gives `slab` (unassigned, or empty in pool `from`) to pool p.
  void Move(std::span<BlockPool> pools, int32_t slab, int32_t from, size_t p);
  // A slab some other pool (`from`) can give p without dropping below its need: an uncaching
  // one first (age 0), else the oldest-emptied cached one (age: when it emptied); never a kept
  // one. -1: none.
  int32_t Donor(std::span<BlockPool> pools, std::span<const int64_t> need, size_t p, int32_t& from,
                uint64_t& age) const;
  int32_t FirstUnkept(const BlockPool& pool, int32_t segment) const;

  std::vector<int32_t> pages_per_slab_;
  int64_t carved_ = 0, reclaimed_ = 0;
  std::vector<int32_t> owner_;
  std::vector<int32_t> unassigned_;  // a stack; capacity num_slabs, so pushes never allocate
  std::vector<uint8_t> kept_;        // per slab, during Reserve: holds a block in `keep`
  std::vector<int64_t> kept_empty_;  // per class, during Reserve: empty slabs that are kept
};

}  // namespace hkv
