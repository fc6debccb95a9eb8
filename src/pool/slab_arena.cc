#include <algorithm>
#include <climits>
#include <memory>

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
    if (pages_per_slab[p] < 1 || num_slabs * pages_per_slab[p] + 1 > INT32_MAX) {
      return Status::InvalidArgument(
          fmt::format("slab arena: class {} has {} pages per slab; expected >= 1 and at most "
                      "2^31 - 2 pages over {} slabs",
                      p, pages_per_slab[p], num_slabs));
    }
  }
  SlabArena a;
  a.pages_per_slab_.assign(pages_per_slab.begin(), pages_per_slab.end());
  a.owner_.assign(static_cast<size_t>(num_slabs), -1);
  a.kept_.assign(static_cast<size_t>(num_slabs), 0);
  a.kept_empty_.assign(pages_per_slab.size(), 0);
  a.unassigned_.reserve(static_cast<size_t>(num_slabs));
  // A stack popped from the back: slab 0 is handed out first.
  for (int64_t s = num_slabs - 1; s >= 0; --s)
    a.unassigned_.push_back(static_cast<int32_t>(s));
  return a;
}

Result<std::vector<BlockPool>> SlabArena::MakePools(bool record_events) const {
  auto clock = std::make_shared<uint64_t>(0);
  std::vector<BlockPool> pools;
  pools.reserve(pages_per_slab_.size());
  for (int32_t per : pages_per_slab_) {
    HKV_ASSIGN_OR_RETURN(
        BlockPool pool,
        BlockPool::CreateSegmented(static_cast<int32_t>(num_slabs()), per, clock, record_events));
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
                         int32_t& from, uint64_t& age) const {
  int32_t best = -1;
  uint64_t best_tick = 0;
  for (size_t q = 0; q < pools.size(); ++q) {
    if (q == p) continue;
    const BlockPool& bq = pools[q];
    if (Spare(pools, q, need[q]) < 1) continue;
    const int32_t plain = FirstUnkept(bq, bq.OldestEmptyUncached());
    if (plain >= 0) {
      from = static_cast<int32_t>(q);
      age = 0;  // caches nothing: older than anything
      return plain;
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

Status SlabArena::Reserve(std::span<BlockPool> pools, std::span<const int64_t> need,
                          std::span<const PoolBlock> keep) {
  if (pools.size() != pages_per_slab_.size() || need.size() != pools.size()) {
    return Status::InvalidArgument(fmt::format("reserve: {} pools and {} needs for {} classes",
                                               pools.size(), need.size(), pages_per_slab_.size()));
  }
  for (const PoolBlock& k : keep) {
    if (k.pool < 0 || static_cast<size_t>(k.pool) >= pools.size() || k.block < 1 ||
        k.block >= pools[static_cast<size_t>(k.pool)].num_blocks()) {
      return Status::InvalidArgument(
          fmt::format("reserve: kept block {} of pool {} does not exist", k.block, k.pool));
    }
  }
  for (const PoolBlock& k : keep) {
    const BlockPool& bp = pools[static_cast<size_t>(k.pool)];
    const int32_t seg = bp.segment_of(k.block);
    if (bp.ref_count(k.block) != 0 || kept_[static_cast<size_t>(seg)] != 0) continue;
    kept_[static_cast<size_t>(seg)] = 1;
    if (bp.segment_held(seg) == 0) ++kept_empty_[static_cast<size_t>(k.pool)];
  }
  const Status s = ReserveKeeping(pools, need);
  for (const PoolBlock& k : keep)
    kept_[static_cast<size_t>(pools[static_cast<size_t>(k.pool)].segment_of(k.block))] = 0;
  std::fill(kept_empty_.begin(), kept_empty_.end(), 0);
  return s;
}

Status SlabArena::ReserveKeeping(std::span<BlockPool> pools, std::span<const int64_t> need) {
  // Feasibility first, so a refusal changes nothing.
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
  // Deficits: any slab will do; the oldest-emptied goes first.
  for (size_t p = 0; p < pools.size(); ++p) {
    while (pools[p].num_free() < need[p]) {
      int32_t from = -1;
      uint64_t age = 0;
      const int32_t slab =
          unassigned_.empty() ? Donor(pools, need, p, from, age) : unassigned_.back();
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
    bool looked = false;
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
          donor = Donor(pools, need, p, from, age);
          looked = true;
        }
        if (donor >= 0 && age <= bp.free_tick(cur)) slab = donor;
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

ArenaUsage SlabArena::Usage(std::span<const BlockPool> pools) const {
  ArenaUsage u;
  u.num_slabs = num_slabs();
  u.unassigned_slabs = num_unassigned();
  u.slabs_carved = carved_;
  u.slabs_reclaimed = reclaimed_;
  u.classes.resize(pools.size());
  for (size_t p = 0; p < pools.size(); ++p) {
    const BlockPool& bp = pools[p];
    ArenaClassUsage& c = u.classes[p];
    for (int32_t seg = 0; seg < bp.num_segments(); ++seg) {
      if (!bp.segment_owned(seg)) continue;
      ++c.slabs;
      if (bp.segment_held(seg) == 0) ++c.empty_slabs;
    }
    c.free_pages = bp.num_free();
    c.held_pages = bp.num_owned() - bp.num_free();
    c.cached_pages = bp.num_free_cached();
    for (int32_t b = bp.NextFree(-1); b >= 0; b = bp.NextFree(b)) {
      if (!bp.has_identity(b) && bp.segment_held(bp.segment_of(b)) > 0) ++c.stranded_pages;
    }
  }
  return u;
}

Status SlabArena::CheckInvariants(std::span<const BlockPool> pools) const {
  const auto fail = [](std::string what) {
    return Status::FailedPrecondition("arena invariant: " + what);
  };
  if (pools.size() != pages_per_slab_.size()) {
    return fail(fmt::format("{} pools for {} classes", pools.size(), pages_per_slab_.size()));
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].num_segments() != num_slabs() || pools[p].segment_blocks() != pages_per_slab_[p]) {
      return fail(fmt::format("pool {} is not segmented as class {} of this arena", p, p));
    }
    HKV_RETURN_IF_ERROR(pools[p].CheckInvariants());
  }
  std::vector<uint8_t> listed(owner_.size(), 0);
  for (int32_t s : unassigned_) {
    if (s < 0 || s >= num_slabs() || listed[static_cast<size_t>(s)]++ != 0) {
      return fail(fmt::format("unassigned stack holds slab {} twice or out of range", s));
    }
  }
  for (int32_t s = 0; s < static_cast<int32_t>(owner_.size()); ++s) {
    const int32_t owner = owner_[static_cast<size_t>(s)];
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
  return Status::Ok();
}

}  // namespace hkv
