#include <algorithm>
#include <climits>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>
#include <hkv/pool/slab_arena.h>

namespace hkv {

Result<SlabArena> SlabArena::Create(int64_t num_slabs, std::span<const int32_t> pages_per_slab) {
  if (num_slabs < 1 || num_slabs > INT32_MAX) {
    return Status::InvalidArgument(
        fmt::format("slab arena of {} slabs: expected 1 to 2^31 - 1", num_slabs));
  }
  if (pages_per_slab.empty()) return Status::InvalidArgument("slab arena: no page classes");
  for (size_t p = 0; p < pages_per_slab.size(); ++p) {
    if (pages_per_slab[p] < 1) {
      return Status::InvalidArgument(fmt::format(
          "slab arena: class {} has {} pages per slab; expected >= 1", p, pages_per_slab[p]));
    }
    if (num_slabs * pages_per_slab[p] + 1 > INT32_MAX) {
      return Status::InvalidArgument(
          fmt::format("slab arena: class {} has {} pages per slab, {} pages over {} slabs; "
                      "expected at most 2^31 - 2",
                      p, pages_per_slab[p], num_slabs * pages_per_slab[p], num_slabs));
    }
  }
  SlabArena a;
  a.pages_per_slab_.assign(pages_per_slab.begin(), pages_per_slab.end());
  a.states_.assign(pages_per_slab.size(), 0);
  a.owner_.assign(static_cast<size_t>(num_slabs), -1);
  a.kept_.assign(static_cast<size_t>(num_slabs), 0);
  a.kept_empty_.assign(pages_per_slab.size(), 0);
  a.slab_moves_.assign(static_cast<size_t>(num_slabs), -1);
  a.unassigned_.reserve(static_cast<size_t>(num_slabs));
  // A stack popped from the back: slab 0 is handed out first.
  for (int64_t s = num_slabs - 1; s >= 0; --s)
    a.unassigned_.push_back(static_cast<int32_t>(s));
  return a;
}

Status SlabArena::SetStateClasses(std::span<const int32_t> classes) {
  for (int32_t p : classes) {
    if (p < 0 || static_cast<size_t>(p) >= states_.size()) {
      return Status::InvalidArgument(fmt::format("slab arena: state class {}: expected 0 to {}", p,
                                                 static_cast<int64_t>(states_.size()) - 1));
    }
  }
  for (int32_t p : classes)
    states_[static_cast<size_t>(p)] = 1;
  return Status::Ok();
}

Result<std::vector<BlockPool>> SlabArena::MakePools(bool record_events) const {
  auto clock = std::make_shared<uint64_t>(0);
  const bool whole_slab_pages =
      pages_per_slab_.size() > 1 &&
      std::find(pages_per_slab_.begin(), pages_per_slab_.end(), 1) != pages_per_slab_.end();
  std::vector<BlockPool> pools;
  pools.reserve(pages_per_slab_.size());
  for (int32_t per : pages_per_slab_) {
    HKV_ASSIGN_OR_RETURN(
        BlockPool pool,
        BlockPool::CreateSegmented(static_cast<int32_t>(num_slabs()), per, clock, record_events));
    // Packing pays where some class's page is a whole slab (a recurrent state): only a slab
    // no other class holds a page in can take one.
    pool.set_pack_segments(whole_slab_pages);
    pools.push_back(std::move(pool));
  }
  return pools;
}

int64_t SlabArena::Spare(std::span<const BlockPool> pools, size_t q, int64_t need_q) const {
  const int64_t surplus = std::max<int64_t>(0, pools[q].num_free() - need_q);
  return std::min<int64_t>(pools[q].num_empty_segments() - kept_empty_[q],
                           surplus / pages_per_slab_[q]);
}

void SlabArena::Move(std::span<BlockPool> pools, int32_t slab, int32_t from, size_t p) {
  if (from >= 0) {
    Status s = pools[static_cast<size_t>(from)].RemoveSegment(slab);
    if (!s.ok()) std::abort();  // Donor chose an empty segment; failing here is a bug
    ++reclaimed_;
  } else {
    unassigned_.pop_back();
    ++carved_;
  }
  if (!pools[p].AddSegment(slab).ok()) std::abort();
  owner_[static_cast<size_t>(slab)] = static_cast<int32_t>(p);
}

int32_t SlabArena::FirstUnkept(const BlockPool& pool, int32_t seg) const {
  while (seg >= 0 && kept_[static_cast<size_t>(seg)] != 0)
    seg = pool.NextEmptySegment(seg);
  return seg;
}

int32_t SlabArena::Donor(std::span<BlockPool> pools, std::span<const int64_t> need, size_t p,
                         bool sparing, int32_t& from, uint64_t& age) const {
  int32_t best = -1;
  uint64_t best_tick = 0;
  for (size_t q = 0; q < pools.size(); ++q) {
    if (q == p) continue;
    const BlockPool& bq = pools[q];
    if (Spare(pools, q, need[q]) < 1) continue;
    // A state class's uncaching slab is its running requests' churn (see the header).
    const bool churn = sparing && states_[q] != 0;
    const int32_t plain = churn ? -1 : FirstUnkept(bq, bq.OldestEmptyUncached());
    if (plain >= 0) {
      // A slab caching nothing costs its class nothing while the class's other uncached pages
      // still cover its need; otherwise the class will evict its least recently freed cached
      // page instead, and the slab is worth that page's age.
      if (bq.num_free() - bq.num_free_cached() - pages_per_slab_[q] >= need[q]) {
        from = static_cast<int32_t>(q);
        age = 0;  // caches nothing: older than anything
        return plain;
      }
      int32_t victim = bq.NextFree(-1);
      while (victim >= 0 && !bq.has_identity(victim))
        victim = bq.NextFree(victim);
      const uint64_t tick = victim < 0 ? 0 : bq.free_tick(victim);
      if (best < 0 || tick < best_tick) {
        best = plain;
        best_tick = tick;
        from = static_cast<int32_t>(q);
      }
    }
    const int32_t seg = FirstUnkept(bq, bq.OldestEmptyCached());
    if (seg < 0) continue;
    const uint64_t tick = bq.empty_since(seg);
    if (best < 0 || tick < best_tick) {
      best = seg;
      best_tick = tick;
      from = static_cast<int32_t>(q);
    }
  }
  age = best_tick;
  return best;
}

Status SlabArena::Keep(std::span<const BlockPool> pools, std::span<const int64_t> need,
                       std::span<const PoolBlock> keep) {
  if (need.size() != pools.size()) {
    return Status::InvalidArgument(fmt::format("reserve: {} pools and {} needs for {} classes",
                                               pools.size(), need.size(), pages_per_slab_.size()));
  }
  HKV_RETURN_IF_ERROR(CheckShapes(pools, "reserve"));
  for (const PoolBlock& k : keep) {
    if (k.pool < 0 || static_cast<size_t>(k.pool) >= pools.size()) {
      return Status::InvalidArgument(
          fmt::format("reserve: kept block {} names pool {}: expected 0 to {}", k.block, k.pool,
                      static_cast<int64_t>(pools.size()) - 1));
    }
    if (k.block < 1 || k.block >= pools[static_cast<size_t>(k.pool)].num_blocks()) {
      return Status::InvalidArgument(
          fmt::format("reserve: kept block {} of pool {}: expected 1 to {}", k.block, k.pool,
                      pools[static_cast<size_t>(k.pool)].num_blocks() - 1));
    }
    // A kept block is a hit about to be acquired: it must be one its pool has (a dormant one
    // would mark another class's slab as kept and break the supply count).
    const BlockPool& bp = pools[static_cast<size_t>(k.pool)];
    if (!bp.segment_owned(bp.segment_of(k.block))) {
      return Status::InvalidArgument(fmt::format(
          "reserve: kept block {} of pool {} lies in slab {}, which that pool does not own",
          k.block, k.pool, bp.segment_of(k.block)));
    }
  }
  for (const PoolBlock& k : keep) {
    const BlockPool& bp = pools[static_cast<size_t>(k.pool)];
    const int32_t seg = bp.segment_of(k.block);
    if (bp.ref_count(k.block) != 0 || kept_[static_cast<size_t>(seg)] != 0) continue;
    kept_[static_cast<size_t>(seg)] = 1;
    if (bp.segment_held(seg) == 0) ++kept_empty_[static_cast<size_t>(k.pool)];
  }
  return Status::Ok();
}

void SlabArena::Unkeep(std::span<const BlockPool> pools, std::span<const PoolBlock> keep) {
  for (const PoolBlock& k : keep)
    kept_[static_cast<size_t>(pools[static_cast<size_t>(k.pool)].segment_of(k.block))] = 0;
  std::fill(kept_empty_.begin(), kept_empty_.end(), 0);
}

Status SlabArena::Reserve(std::span<BlockPool> pools, std::span<const int64_t> need,
                          std::span<const PoolBlock> keep) {
  HKV_RETURN_IF_ERROR(Keep(pools, need, keep));
  const Status s = ReserveKeeping(pools, need);
  Unkeep(pools, keep);
  return s;
}

Status SlabArena::CheckReserve(std::span<const BlockPool> pools, std::span<const int64_t> need,
                               std::span<const PoolBlock> keep) {
  HKV_RETURN_IF_ERROR(Keep(pools, need, keep));
  const Status s = Feasible(pools, need);
  Unkeep(pools, keep);
  return s;
}

Status SlabArena::Feasible(std::span<const BlockPool> pools, std::span<const int64_t> need) const {
  int64_t short_slabs = 0;
  int64_t supply = num_unassigned();
  for (size_t p = 0; p < pools.size(); ++p) {
    if (need[p] < 0) {
      return Status::InvalidArgument(fmt::format("reserve: class {} needs {} pages", p, need[p]));
    }
    const int64_t deficit = need[p] - pools[p].num_free();
    if (deficit > 0) {
      short_slabs += CeilDiv(deficit, pages_per_slab_[p]);
    } else {
      supply += Spare(pools, p, need[p]);
    }
  }
  if (short_slabs > supply) {
    return Status::ResourceExhausted(
        fmt::format("reserve: the classes need {} more slab(s) than the {} that can be given",
                    short_slabs, supply));
  }
  return Status::Ok();
}

Status SlabArena::ReserveKeeping(std::span<BlockPool> pools, std::span<const int64_t> need) {
  // Feasibility first, so a refusal changes nothing.
  HKV_RETURN_IF_ERROR(Feasible(pools, need));
  // Deficits: any slab will do; the oldest-emptied goes first.
  for (size_t p = 0; p < pools.size(); ++p) {
    while (pools[p].num_free() < need[p]) {
      int32_t from = -1;
      uint64_t age = 0;
      const int32_t slab =
          unassigned_.empty() ? Donor(pools, need, p, false, from, age) : unassigned_.back();
      if (slab < 0) std::abort();  // the feasibility check guaranteed a slab
      Move(pools, slab, from, p);
    }
  }
  // Pages a class would take by evicting its own cached pages: a slab instead when one is free
  // or emptied earlier. Walks the free list in the order Allocate takes it.
  for (size_t p = 0; p < pools.size(); ++p) {
    BlockPool& bp = pools[p];
    int64_t remaining = need[p];
    if (remaining == 0 || bp.num_free_cached() == 0) continue;
    // The best other slab changes only when one moves, so it is looked up once per move, not
    // once per page walked.
    int32_t from = -1;
    uint64_t age = 0;
    int32_t donor = -1;
    bool looked = false, plain_donor = false;
    int32_t cur = bp.NextFree(-1);
    while (remaining > 0 && cur >= 0) {
      if (!bp.has_identity(cur)) {
        --remaining;
        cur = bp.NextFree(cur);
        continue;
      }
      int32_t slab = -1;
      if (!unassigned_.empty()) {
        slab = unassigned_.back();
        from = -1;
      } else {
        if (!looked) {
          donor = Donor(pools, need, p, true, from, age);
          plain_donor = donor >= 0 && pools[static_cast<size_t>(from)].segment_cached(donor) == 0;
          looked = true;
        }
        // No slab can come until one moves, and none will: the rest of the walk is moot.
        if (donor < 0) break;
        // Ties go to the class's own page: two worthless (demoted, tick 0) pages are worth the
        // same, and a slab taken from another class rarely comes back. A donor caching nothing
        // (plain free memory, age 0) is taken before any cached page.
        if (age < bp.free_tick(cur) || (age == 0 && plain_donor)) slab = donor;
      }
      if (slab >= 0) {
        Move(pools, slab, from, p);  // its pages go ahead of `cur`, uncached
        remaining -= std::min<int64_t>(remaining, pages_per_slab_[p]);
        looked = false;
      } else {
        --remaining;
        cur = bp.NextFree(cur);
      }
    }
  }
  return Status::Ok();
}

namespace {

// A free page compaction may drop (as a destination, or in a slab it empties): one caching
// nothing, or caching what was freed before `older_than`.
bool Droppable(const BlockPool& bp, int32_t b, uint64_t older_than) {
  return !bp.has_identity(b) || bp.free_tick(b) < older_than;
}

// Free pages of a slab compaction may drop.
int32_t DroppablePages(const BlockPool& bp, int32_t per, int32_t seg, uint64_t older_than) {
  if (older_than == UINT64_MAX) return per - bp.segment_held(seg);
  int32_t n = 0;
  const int32_t first = seg * per + 1;
  for (int32_t b = first; b < first + per; ++b)
    n += bp.ref_count(b) == 0 && Droppable(bp, b, older_than) ? 1 : 0;
  return n;
}

// A free page that moves with its slab's held pages when compaction drops only older cache: it
// caches something freed at or after `older_than`.
bool Keeps(const BlockPool& bp, int32_t b, uint64_t older_than) {
  return bp.ref_count(b) == 0 && bp.has_identity(b) && bp.free_tick(b) >= older_than;
}

// The slabs of a class that take part in compaction, in the order they are emptied. Only partly
// held slabs take part: full ones have nowhere to receive pages, empty ones are shared memory
// already. `room[seg]`: the droppable free pages of a candidate; the first `eligible` candidates
// may be emptied, the rest only receive pages. Each page of an emptied slab that is not
// droppable moves: a full compaction may empty only slabs whose free pages are all droppable,
// one that drops only older cache (`older_than` given) moves the younger cached pages too, so any
// candidate may be emptied, the cheapest (fewest pages to move) first.
void CompactionCandidates(const BlockPool& bp, int32_t per, uint64_t older_than,
                          std::vector<int32_t>& candidates, std::vector<int32_t>& room,
                          size_t& eligible) {
  candidates.clear();
  room.assign(static_cast<size_t>(bp.num_segments()), 0);
  for (int32_t seg = 0; seg < bp.num_segments(); ++seg) {
    if (!bp.segment_owned(seg)) continue;
    const int32_t held = bp.segment_held(seg);
    if (held == 0 || held == per) continue;
    room[static_cast<size_t>(seg)] = DroppablePages(bp, per, seg, older_than);
    candidates.push_back(seg);
  }
  const bool move_cached = older_than != UINT64_MAX;
  const auto may_empty = [&](int32_t seg) {
    return move_cached || room[static_cast<size_t>(seg)] == per - bp.segment_held(seg);
  };
  // Slabs that may be emptied first; among them fewest pages to move first (cheapest to empty),
  // then fewest identities (least cache lost).
  std::sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
    if (may_empty(a) != may_empty(b)) return may_empty(a);
    const int32_t ha = per - room[static_cast<size_t>(a)], hb = per - room[static_cast<size_t>(b)];
    if (ha != hb) return ha < hb;
    const int32_t ca = bp.segment_cached(a), cb = bp.segment_cached(b);
    return ca != cb ? ca < cb : a < b;
  });
  eligible = static_cast<size_t>(std::find_if_not(candidates.begin(), candidates.end(), may_empty) -
                                 candidates.begin());
}

// Victims are a prefix of the eligible candidates: the first k, as long as the pages they move
// (all but the droppable ones) fit in the droppable free pages of the slabs after them. Moving
// grows and room shrinks with k, so the feasible k are 0..kmax. Returns k; `moving` gets the
// victims' pages to move.
size_t CountVictims(int32_t per, std::span<const int32_t> candidates,
                    std::span<const int32_t> slab_room, size_t eligible, int64_t max_slabs,
                    int64_t& moving) {
  int64_t room = 0;
  for (int32_t seg : candidates)
    room += slab_room[static_cast<size_t>(seg)];
  moving = 0;
  size_t k = 0;
  while (k < eligible && static_cast<int64_t>(k) < max_slabs) {
    const int32_t own = slab_room[static_cast<size_t>(candidates[k])];
    const int32_t held = per - own;
    if (moving + held > room - own) break;
    moving += held;
    room -= own;
    ++k;
  }
  return k;
}

// Destinations for `moving` pages in the slabs after the first k: uncached free pages of the
// fullest slabs first (filling them is what removes stranding), then cached ones, oldest first
// (the cheapest cache to lose). The walk stops once every page has a destination: emptying a few
// slabs does not walk every page of a large class.
void PickDestinations(const BlockPool& bp, int32_t per, std::span<const int32_t> candidates,
                      size_t k, int64_t moving, uint64_t older_than, std::vector<int32_t>& dest,
                      std::vector<std::pair<uint64_t, int32_t>>& cached_dest) {
  dest.clear();
  for (size_t i = candidates.size(); i-- > k && static_cast<int64_t>(dest.size()) < moving;) {
    const int32_t first = candidates[i] * per + 1;
    for (int32_t b = first; b < first + per && static_cast<int64_t>(dest.size()) < moving; ++b) {
      if (bp.ref_count(b) == 0 && !bp.has_identity(b)) dest.push_back(b);
    }
  }
  if (static_cast<int64_t>(dest.size()) >= moving) return;
  cached_dest.clear();
  for (size_t i = k; i < candidates.size(); ++i) {
    const int32_t first = candidates[i] * per + 1;
    for (int32_t b = first; b < first + per; ++b) {
      if (bp.ref_count(b) == 0 && bp.has_identity(b) && bp.free_tick(b) < older_than) {
        cached_dest.emplace_back(bp.free_tick(b), b);
      }
    }
  }
  std::sort(cached_dest.begin(), cached_dest.end());
  for (const auto& [tick, b] : cached_dest) {
    if (static_cast<int64_t>(dest.size()) == moving) break;
    dest.push_back(b);
  }
}

}  // namespace

Status SlabArena::PlanCompaction(std::span<const BlockPool> pools, int32_t pool, int64_t max_slabs,
                                 CompactionPlan& plan, uint64_t older_than) {
  HKV_RETURN_IF_ERROR(CheckShapes(pools, "plan compaction"));
  if (pool < 0 || static_cast<size_t>(pool) >= pools.size()) {
    return Status::InvalidArgument(fmt::format("plan compaction: class {}: expected 0 to {}", pool,
                                               static_cast<int64_t>(pools.size()) - 1));
  }
  if (max_slabs < 0) {
    return Status::InvalidArgument(
        fmt::format("plan compaction: at most {} slabs: expected a limit >= 0", max_slabs));
  }
  const BlockPool& bp = pools[static_cast<size_t>(pool)];
  const int32_t per = pages_per_slab_[static_cast<size_t>(pool)];
  size_t eligible = 0;
  CompactionCandidates(bp, per, older_than, candidates_, slab_room_, eligible);
  int64_t moving = 0;
  const size_t k = CountVictims(per, candidates_, slab_room_, eligible, max_slabs, moving);
  if (k == 0) return Status::Ok();
  PickDestinations(bp, per, candidates_, k, moving, older_than, dest_, cached_dest_);
  size_t next = 0;
  for (size_t i = 0; i < k; ++i) {
    const int32_t slab = candidates_[i];
    const int32_t first = slab * per + 1;
    // The younger cached pages first: BlockPool::MoveCached needs their slab still in use.
    for (int32_t b = first; b < first + per; ++b) {
      if (Keeps(bp, b, older_than)) plan.moves.push_back({pool, b, dest_[next++]});
    }
    for (int32_t b = first; b < first + per; ++b) {
      if (bp.ref_count(b) > 0) plan.moves.push_back({pool, b, dest_[next++]});
    }
    plan.slabs.push_back(slab);
  }
  return Status::Ok();
}

Status SlabArena::CheckShapes(std::span<const BlockPool> pools, const char* call) const {
  if (pools.size() != pages_per_slab_.size()) {
    return Status::InvalidArgument(
        fmt::format("{}: {} pools for {} classes", call, pools.size(), pages_per_slab_.size()));
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].num_segments() != num_slabs()) {
      return Status::InvalidArgument(
          fmt::format("{}: pool {} has {} segments; expected this arena's {} slabs", call, p,
                      pools[p].num_segments(), num_slabs()));
    }
    if (pools[p].segment_blocks() != pages_per_slab_[p]) {
      return Status::InvalidArgument(fmt::format(
          "{}: pool {} has {} blocks per segment; expected the {} pages per slab of class {}", call,
          p, pools[p].segment_blocks(), pages_per_slab_[p], p));
    }
  }
  return Status::Ok();
}

Status SlabArena::CheckPlan(std::span<const BlockPool> pools, const CompactionPlan& plan) {
  const auto bad = [](std::string what) { return Status::InvalidArgument("compact: " + what); };
  for (int32_t slab : plan.slabs) {
    if (slab < 0 || slab >= num_slabs()) {
      return bad(fmt::format("slab {}: expected 0 to {}", slab, num_slabs() - 1));
    }
    if (owner_[static_cast<size_t>(slab)] < 0) {
      return bad(fmt::format("slab {} is not owned by any class", slab));
    }
    int32_t& listed = slab_moves_[static_cast<size_t>(slab)];
    if (listed >= 0) return bad(fmt::format("slab {} is listed twice", slab));
    listed = 0;
  }
  for (const PageMove& m : plan.moves) {
    if (m.pool < 0 || static_cast<size_t>(m.pool) >= pools.size()) {
      return bad(fmt::format("a move names pool {} of {}", m.pool, pools.size()));
    }
    const BlockPool& bp = pools[static_cast<size_t>(m.pool)];
    for (const auto& [role, block] :
         {std::pair{"source", m.src}, std::pair{"destination", m.dst}}) {
      if (block < 1 || block >= bp.num_blocks()) {
        return bad(fmt::format("move {} -> {} of pool {}: {} {}: blocks are 1 to {}", m.src, m.dst,
                               m.pool, role, block, bp.num_blocks() - 1));
      }
    }
    const int32_t from = bp.segment_of(m.src), to = bp.segment_of(m.dst);
    if (slab_moves_[static_cast<size_t>(from)] < 0) {
      return bad(fmt::format("move {} -> {}: slab {} of the source is not listed in the plan",
                             m.src, m.dst, from));
    }
    if (owner_[static_cast<size_t>(from)] != m.pool) {
      return bad(fmt::format("move {} -> {}: slab {} of the source is not owned by pool {}", m.src,
                             m.dst, from, m.pool));
    }
    if (owner_[static_cast<size_t>(to)] != m.pool || slab_moves_[static_cast<size_t>(to)] >= 0) {
      return bad(fmt::format(
          "move {} -> {}: the destination's slab {} is {}", m.src, m.dst, to,
          owner_[static_cast<size_t>(to)] != m.pool ? "not owned by the pool" : "being emptied"));
    }
    const bool cached = bp.ref_count(m.src) == 0;
    if (cached && !bp.has_identity(m.src)) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: the source is free and caches nothing; expected a held or "
          "cached page",
          m.src, m.dst, m.pool));
    }
    if (cached && slab_moves_[static_cast<size_t>(from)] == bp.segment_held(from)) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: a cached page moves after every held page of slab {}; "
          "expected it first, while the slab is in use",
          m.src, m.dst, m.pool, from));
    }
    if (cached && bp.segment_held(to) == 0) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: a cached page moves into slab {}, which holds no page", m.src,
          m.dst, m.pool, to));
    }
    if (bp.ref_count(m.dst) != 0) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: the destination is held (ref {}); expected it free", m.src,
          m.dst, m.pool, bp.ref_count(m.dst)));
    }
    std::vector<uint8_t>& marks = page_marks_[static_cast<size_t>(m.pool)];
    if (marks[static_cast<size_t>(m.src)] != 0) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: the source page is already {} by an earlier "
          "move",
          m.src, m.dst, m.pool, marks[static_cast<size_t>(m.src)] == 1 ? "moved away" : "filled"));
    }
    if (marks[static_cast<size_t>(m.dst)] != 0) {
      return bad(fmt::format(
          "move {} -> {} of pool {}: the destination page is already {} by an "
          "earlier move",
          m.src, m.dst, m.pool, marks[static_cast<size_t>(m.dst)] == 1 ? "moved away" : "filled"));
    }
    marks[static_cast<size_t>(m.src)] = 1;
    marks[static_cast<size_t>(m.dst)] = 2;
    if (!cached) ++slab_moves_[static_cast<size_t>(from)];
  }
  for (int32_t slab : plan.slabs) {
    const int32_t owner = owner_[static_cast<size_t>(slab)];
    const int32_t held = pools[static_cast<size_t>(owner)].segment_held(slab);
    if (slab_moves_[static_cast<size_t>(slab)] != held) {
      return bad(fmt::format("slab {} holds {} page(s) of class {} but {} move(s) empty it", slab,
                             held, owner, slab_moves_[static_cast<size_t>(slab)]));
    }
  }
  return Status::Ok();
}

void SlabArena::ClearPlanMarks(std::span<const BlockPool> pools, const CompactionPlan& plan) {
  for (int32_t slab : plan.slabs) {
    if (slab >= 0 && slab < num_slabs()) slab_moves_[static_cast<size_t>(slab)] = -1;
  }
  for (const PageMove& m : plan.moves) {
    if (m.pool < 0 || static_cast<size_t>(m.pool) >= pools.size()) continue;
    std::vector<uint8_t>& marks = page_marks_[static_cast<size_t>(m.pool)];
    for (int32_t b : {m.src, m.dst}) {
      if (b >= 0 && static_cast<size_t>(b) < marks.size()) marks[static_cast<size_t>(b)] = 0;
    }
  }
}

Status SlabArena::Compact(std::span<BlockPool> pools, const CompactionPlan& plan, int32_t to_pool) {
  HKV_RETURN_IF_ERROR(CheckShapes(pools, "compact"));
  if (to_pool < -1 || to_pool >= static_cast<int32_t>(pools.size())) {
    return Status::InvalidArgument(
        fmt::format("compact: emptied slabs to class {}: expected -1 (unassigned) or 0 to {}",
                    to_pool, static_cast<int64_t>(pools.size()) - 1));
  }
  if (page_marks_.empty()) {
    for (const BlockPool& bp : pools)
      page_marks_.emplace_back(static_cast<size_t>(bp.num_blocks()), 0);
  }
  const Status valid = CheckPlan(pools, plan);
  ClearPlanMarks(pools, plan);
  HKV_RETURN_IF_ERROR(valid);
  for (const PageMove& m : plan.moves) {
    BlockPool& bp = pools[static_cast<size_t>(m.pool)];
    const bool held = bp.ref_count(m.src) > 0;
    cached_moved_ += held ? 0 : 1;
    const Status moved = held ? bp.MoveHeld(m.src, m.dst) : bp.MoveCached(m.src, m.dst);
    if (!moved.ok()) std::abort();  // checked
  }
  for (int32_t slab : plan.slabs) {
    const auto owner = static_cast<size_t>(owner_[static_cast<size_t>(slab)]);
    if (!pools[owner].RemoveSegment(slab).ok()) std::abort();  // every held page moved out
    owner_[static_cast<size_t>(slab)] = -1;
    unassigned_.push_back(slab);  // capacity num_slabs: never allocates
    if (to_pool >= 0) Move(pools, slab, -1, static_cast<size_t>(to_pool));  // pops it again
  }
  compacted_ += static_cast<int64_t>(plan.slabs.size());
  moved_ += static_cast<int64_t>(plan.moves.size());
  return Status::Ok();
}

ArenaUsage SlabArena::Usage(std::span<const BlockPool> pools) const {
  ArenaUsage u;
  u.num_slabs = num_slabs();
  u.unassigned_slabs = num_unassigned();
  u.slabs_carved = carved_;
  u.slabs_reclaimed = reclaimed_;
  u.slabs_compacted = compacted_;
  u.pages_moved = moved_;
  u.cached_pages_moved = cached_moved_;
  u.classes.resize(pools.size());
  for (size_t p = 0; p < pools.size(); ++p) {
    const BlockPool& bp = pools[p];
    ArenaClassUsage& c = u.classes[p];
    c.slabs = bp.num_owned() / bp.segment_blocks();
    c.empty_slabs = bp.num_empty_segments();
    c.free_pages = bp.num_free();
    c.held_pages = bp.num_owned() - bp.num_free();
    c.cached_pages = bp.num_free_cached();
    c.stranded_pages = bp.StrandedBlocks();
  }
  return u;
}

Status SlabArena::CheckInvariants(std::span<const BlockPool> pools) const {
  const auto fail = [](std::string what) {
    return Status::FailedPrecondition("arena invariant: " + what);
  };
  if (const Status shapes = CheckShapes(pools, "pools"); !shapes.ok()) {
    return fail(std::string(shapes.message()));
  }
  for (const BlockPool& bp : pools)
    HKV_RETURN_IF_ERROR(bp.CheckInvariants());
  std::vector<uint8_t> listed(owner_.size(), 0);
  for (int32_t s : unassigned_) {
    if (s < 0 || s >= num_slabs() || listed[static_cast<size_t>(s)]++ != 0) {
      return fail(fmt::format("unassigned stack holds slab {} twice or out of range", s));
    }
  }
  if (unassigned_.capacity() < owner_.size()) {
    return fail("the unassigned stack could reallocate when slabs return to it");
  }
  int64_t owned = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(owner_.size()); ++s) {
    const int32_t owner = owner_[static_cast<size_t>(s)];
    owned += owner >= 0 ? 1 : 0;
    if (kept_[static_cast<size_t>(s)] != 0 || slab_moves_[static_cast<size_t>(s)] != -1) {
      return fail(fmt::format("slab {} is still marked by a Reserve or Compact that ended", s));
    }
    if ((owner < 0) != (listed[static_cast<size_t>(s)] != 0)) {
      return fail(fmt::format("slab {} is {} but {} the unassigned stack", s,
                              owner < 0 ? "unowned" : "owned", owner < 0 ? "not on" : "on"));
    }
    for (size_t p = 0; p < pools.size(); ++p) {
      if (pools[p].segment_owned(s) != (owner == static_cast<int32_t>(p))) {
        return fail(fmt::format("slab {} belongs to class {} but pool {} {} it", s, owner, p,
                                pools[p].segment_owned(s) ? "owns" : "does not own"));
      }
    }
  }
  // Slabs leave the unassigned stack only by carving and return only by compaction.
  if (owned != carved_ - compacted_) {
    return fail(fmt::format("{} slabs are owned, but {} were carved and {} returned by compaction",
                            owned, carved_, compacted_));
  }
  for (int64_t k : kept_empty_) {
    if (k != 0) return fail("a Reserve left kept empty slabs counted");
  }
  for (size_t p = 0; p < page_marks_.size(); ++p) {
    if (std::any_of(page_marks_[p].begin(), page_marks_[p].end(), [](uint8_t m) { return m; })) {
      return fail(fmt::format("pool {} has pages still marked by a Compact that ended", p));
    }
  }
  return Status::Ok();
}

}  // namespace hkv
