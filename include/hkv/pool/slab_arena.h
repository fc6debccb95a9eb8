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
//   became empty strictly before the page it would evict was freed: eviction follows one age
//   order across classes, and between two things worth nothing (demoted pages and slabs, both of
//   age 0) a class evicts its own. An uncaching slab is free to take only while its class's other
//   uncached pages still cover that class's need; otherwise taking it makes the class evict its
//   least recently freed cached page, and the slab counts as that old (so a slab a class was
//   just given for its need is never taken back in the same call). Except a state class's
//   uncaching slab (SetStateClasses: recurrent states no request holds): another class takes it
//   only when short of pages (the deficit), never to spare its own cached pages. Such pages are
//   the churn of the class's running requests (a state is written to a fresh page at every
//   published or kept position), which need them again within a step or two; taken, the class
//   evicts cached states for its next pages to save the taker a slab's worth of its oldest cached
//   pages, and the taker's slabs rarely come back whole (its held pages scatter over them).
//   Measured in docs/manager.md ("Which class gives a slab up").
// - Arenas where some class's page is a whole slab (a recurrent state) pack: each pool reuses its
//   worthless pages (no identity, or demoted) segment by segment (BlockPool::set_pack_segments),
//   so a class's held pages gather in few slabs and the others can empty whole.
// - Stranded pages are free pages that cache nothing inside slabs that still hold pages of
//   their class: no other class can use them. Usage() measures them; a class takes a new slab
//   only when it has no such page left, so they never exceed what its own frees left behind.
// - Compaction removes stranding that placement could not avoid (a class holding every other
//   page): PlanCompaction picks slabs of one class to empty, fewest held pages first, and a free
//   page of the same class for each of their held pages, in the class's other partly held slabs
//   (uncached pages first, then the oldest cached), never in a slab being emptied; a slab is
//   picked only if all its held pages can move. A compaction bounded by an age (for a class that
//   would evict a page that old) moves the younger cached pages of the slabs it empties too
//   (BlockPool::MoveCached), so it drops only older cache. Compact validates a plan, then moves
//   the pages (BlockPool::MoveHeld), drops what the emptied slabs still cache and returns them to
//   the unassigned slabs. Whoever holds the pages' ids must rewrite them, and whoever owns the
//   memory must copy each page src -> dst before it is read again. Planning with no limit on
//   slabs leaves a class fewer than pages_per_slab free pages in slabs holding its pages, so
//   fewer than one slab's worth stranded.
// Reserve allocates nothing; it is linear in the pages reserved. Compaction reuses scratch
// buffers the arena keeps; it is linear in the class's pages.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/arena_usage.h>
#include <hkv/pool/block_pool.h>

namespace hkv {

// A block of one of the arena's pools.
struct PoolBlock {
  int32_t pool = 0;
  int32_t block = 0;
};

class SlabArena {
 public:
  SlabArena() = default;
  // num_slabs slabs; pages_per_slab[p] pages of class p fit in one slab (each >= 1).
  static Result<SlabArena> Create(int64_t num_slabs, std::span<const int32_t> pages_per_slab);
  // One segmented pool per class (block ids 1 + slab * pages_per_slab + page), sharing one
  // eviction clock, owning nothing yet.
  Result<std::vector<BlockPool>> MakePools(bool record_events) const;
  // Marks the classes whose pages are recurrent states (see Reserve: their uncaching slabs go to
  // another class only to meet a deficit). kInvalidArgument (nothing changed) for a class out of
  // range. None by default.
  Status SetStateClasses(std::span<const int32_t> classes);
  bool is_state_class(size_t p) const { return states_[p] != 0; }

  // `keep` lists free blocks the caller is about to acquire (prefix hits): their slabs are not
  // given away.
  Status Reserve(std::span<BlockPool> pools, std::span<const int64_t> need,
                 std::span<const PoolBlock> keep = {});
  // What Reserve would answer, moving nothing: Ok exactly when Reserve would succeed, else the
  // same refusal.
  Status CheckReserve(std::span<const BlockPool> pools, std::span<const int64_t> need,
                      std::span<const PoolBlock> keep = {});

  int64_t num_slabs() const { return static_cast<int64_t>(owner_.size()); }
  int64_t num_unassigned() const { return static_cast<int64_t>(unassigned_.size()); }
  int32_t pages_per_slab(size_t p) const { return pages_per_slab_[p]; }
  int32_t owner(int64_t slab) const { return owner_[static_cast<size_t>(slab)]; }  // -1: none

  // Appends to `plan` up to max_slabs (>= 0) slabs of class `pool` to empty and the moves that
  // empty them; nothing when no slab can be emptied. Changes no pool. `older_than`: drop no
  // cache freed at or after that tick (a compaction for a class that would otherwise evict a page
  // of that age; by default, any): the free pages caching something that young move with the
  // slab's held pages (listed before them: BlockPool::MoveCached keeps their identity and place
  // in the eviction order), the slabs with the fewest pages to move are emptied first, and only
  // uncached pages or cached ones freed before it receive the moves.
  Status PlanCompaction(std::span<const BlockPool> pools, int32_t pool, int64_t max_slabs,
                        CompactionPlan& plan, uint64_t older_than = UINT64_MAX);
  // Performs a plan: every slab listed is owned, listed once and has exactly its held pages
  // moved, and maybe free cached pages (each before the last held page of its slab moves, into a
  // slab that holds a page); every move goes from a held or cached page of a listed slab to a
  // free page of the same pool outside them, no page twice. kInvalidArgument (nothing changed)
  // otherwise. The emptied slabs
  // go to class `to_pool` (its pages free and uncached) when one is given (>= 0, a valid class),
  // else back to the unassigned slabs.
  Status Compact(std::span<BlockPool> pools, const CompactionPlan& plan, int32_t to_pool = -1);

  ArenaUsage Usage(std::span<const BlockPool> pools) const;
  // Every slab has one owner or none, the pools own exactly the slabs the arena says (as many as
  // were carved and not returned by compaction), every pool's own invariants hold, and the
  // scratch marks of Reserve and Compact are clear between calls.
  Status CheckInvariants(std::span<const BlockPool> pools) const;

 private:
  // Largest number of slabs pool q can give up and still allocate need_q pages.
  int64_t Spare(std::span<const BlockPool> pools, size_t q, int64_t need_q) const;
  Status ReserveKeeping(std::span<BlockPool> pools, std::span<const int64_t> need);
  // Reserve's checks of its arguments, and of the keeps' slabs (marked in kept_ until Unkeep).
  Status Keep(std::span<const BlockPool> pools, std::span<const int64_t> need,
              std::span<const PoolBlock> keep);
  void Unkeep(std::span<const BlockPool> pools, std::span<const PoolBlock> keep);
  // Whether every class's need can be met by moving slabs (the feasibility ReserveKeeping checks
  // before it moves any).
  Status Feasible(std::span<const BlockPool> pools, std::span<const int64_t> need) const;
  // Gives `slab` (unassigned, or empty in pool `from`) to pool p.
  void Move(std::span<BlockPool> pools, int32_t slab, int32_t from, size_t p);
  // A slab some other pool (`from`) can give p without dropping below its need: an uncaching
  // one first (age 0), else the oldest-emptied cached one (age: when it emptied); never a kept
  // one. -1: none. `sparing`: p is not short, only about to evict its own cached pages, and a
  // state class's uncaching slab is not offered.
  int32_t Donor(std::span<BlockPool> pools, std::span<const int64_t> need, size_t p, bool sparing,
                int32_t& from, uint64_t& age) const;
  int32_t FirstUnkept(const BlockPool& pool, int32_t segment) const;

  Status CheckShapes(std::span<const BlockPool> pools, const char* call) const;
  Status CheckPlan(std::span<const BlockPool> pools, const CompactionPlan& plan);
  void ClearPlanMarks(std::span<const BlockPool> pools, const CompactionPlan& plan);

  std::vector<int32_t> pages_per_slab_;
  std::vector<uint8_t> states_;  // per class: 1 where its pages are recurrent states
  int64_t carved_ = 0, reclaimed_ = 0, compacted_ = 0, moved_ = 0, cached_moved_ = 0;
  std::vector<int32_t> owner_;
  std::vector<int32_t> unassigned_;  // a stack; capacity num_slabs, so pushes never allocate
  std::vector<uint8_t> kept_;        // per slab, during Reserve: holds a block in `keep`
  std::vector<int64_t> kept_empty_;  // per class, during Reserve: empty slabs that are kept
  // Compaction scratch, grown on first use and kept: candidate slabs, destination pages, and
  // per-slab / per-page marks that Compact's validation sets and clears again.
  std::vector<int32_t> candidates_;
  std::vector<int32_t> slab_room_;  // per slab: free pages a compaction may drop
  std::vector<int32_t> dest_;
  std::vector<std::pair<uint64_t, int32_t>> cached_dest_;  // (free tick, page)
  std::vector<int32_t> slab_moves_;               // per slab: moves out of it, or -1 unlisted
  std::vector<std::vector<uint8_t>> page_marks_;  // per pool and page: 1 source, 2 destination
};

}  // namespace hkv
