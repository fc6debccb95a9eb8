// StateGroup: one live state per request, checkpoints published at Commit and Free, speculative
// states kept for Truncate, copy-on-write of shared states by never writing them in place.
#include "state_group.h"

#include <algorithm>

#include <fmt/format.h>

namespace hkv::manager_internal {

int64_t StateGroup::LookupBound(const Request& r, int64_t x, int64_t) {
  const BlockPool& bp = block_pool();
  while (x > 0 && !core_.Available(bp, Key(r, x)))
    x -= core_.align;
  return x;
}

void StateGroup::ExternalCandidates(const Request& r, int64_t cap,
                                    std::vector<PrefixKey>& out) const {
  const BlockPool& bp = block_pool();
  for (int64_t p = core_.align; p <= cap; p += core_.align) {
    const PrefixKey k = Key(r, p);
    if (bp.Find(k) < 0) out.push_back(k);
  }
}

int32_t StateGroup::CountLoads(const Request& r, int64_t tokens) const {
  if (tokens <= 0) return 0;
  return block_pool().Find(Key(r, tokens)) < 0 ? 1 : 0;
}

int64_t StateGroup::TruncateBound(const Request& r, int64_t x, int64_t new_known) const {
  const StateSlot& ss = slot_at(r.slot);
  int64_t best = 0;
  if (r.computed <= x) best = r.computed;
  if (ss.rolling.block != BlockPool::kNullBlock && ss.rolling.position <= x) {
    best = std::max(best, ss.rolling.position);
  }
  for (const HeldState& h : ss.held) {
    if (h.position <= x) best = std::max(best, h.position);
  }
  const int64_t align = core_.align;
  for (int64_t p = std::min(x, new_known) / align * align; p > best; p -= align) {
    if (block_pool().Find(Key(r, p)) >= 0) return p;
  }
  return best;
}

bool StateGroup::InPlace(const StateSlot& ss, bool started) const {
  const BlockPool& bp = block_pool();
  return started && ss.live != BlockPool::kNullBlock && bp.ref_count(ss.live) == 1 &&
         !bp.has_identity(ss.live);
}

Status StateGroup::PlanStep(const Request& r, const StepPlan& s, HitPlan& hp, int64_t& need) const {
  const BlockPool& bp = block_pool();
  if (!s.started && s.begin > 0) {
    const int32_t b = bp.Find(Key(r, s.begin));
    if (b < 0) {
      if (!hp.TakeLoad(need)) return StaleHit(r, "a recurrent checkpoint");
    } else {
      if (bp.ref_count(b) == 0) {
        ++need;
        core_.hit_keep.push_back({pool(), b});
      }
      hp.blocks.push_back(b);
    }
  }
  const bool in_place = InPlace(slot_at(r.slot), s.started);
  need += (in_place ? 0 : 1) + static_cast<int64_t>(s.snapshots.size());
  return Status::Ok();
}

void StateGroup::ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) {
  if (s.begin <= 0) return;
  const int32_t b = hp.blocks[hp.next++];
  if (b == HitPlan::kLoad) {
    r.loads.push_back({group_, pool(), BlockPool::kNullBlock, Key(r, s.begin), true, s.begin});
    hp.load_index.push_back(-1);
    return;
  }
  core_.AcquireHeld(pool(), b);
  slot_at(r.slot).live = b;
}

void StateGroup::PlaceLoad(Request& r, int64_t, int32_t block) {
  slot_at(r.slot).live = block;
}

void StateGroup::ApplyStep(Request& r, const StepPlan& s) {
  StateSlot& ss = slot_at(r.slot);
  ss.read = ss.live;
  const bool in_place = InPlace(ss, s.started);
  const std::span<const int32_t> fresh =
      core_.AllocateReserved(pool(), static_cast<int64_t>(s.snapshots.size()) + (in_place ? 0 : 1));
  size_t k = 0;
  ss.write = in_place ? ss.live : fresh[k++];
  ss.snaps.clear();
  for (int64_t p : s.snapshots)
    ss.snaps.push_back({p, fresh[k++]});
}

bool StateGroup::StepIsFree(const Request& r, const StepPlan& s) const {
  if (!s.started || !s.snapshots.empty()) return false;
  const StateSlot& ss = slot_at(r.slot);
  return ss.held.empty() && InPlace(ss, true);
}

void StateGroup::ApplyFreeStep(Request& r) {
  // ApplyStep's in-place case with no snapshots, which allocates nothing.
  StateSlot& ss = slot_at(r.slot);
  ss.read = ss.write = ss.live;
  ss.snaps.clear();
}

void StateGroup::EndPreviousStep(Request& r) {
  // The request has moved on, so Truncate no longer needs the speculative states it kept.
  StateSlot& ss = slot_at(r.slot);
  for (const HeldState& h : ss.held)
    core_.ReleaseOne(pool(), h.block, r.retention);
  ss.held.clear();
}

Status StateGroup::CheckCommit(const Request& r, int64_t c) const {
  if (c == r.step_end) return Status::Ok();
  const StateSlot& ss = slot_at(r.slot);
  const bool snapshot = std::any_of(ss.snaps.begin(), ss.snaps.end(),
                                    [&](const StateSnapshot& s) { return s.position == c; });
  // At the step's begin the read state serves, unless the step overwrote it in place.
  const bool intact_read = c == r.step_begin && ss.write != ss.read;
  if (snapshot || intact_read) return Status::Ok();
  return Status::InvalidArgument(fmt::format(
      "commit: request {}: no recurrent state after {} tokens (group {}); a step can stop "
      "early only at speculative positions (>= {} known tokens){}",
      r.id, c, group_, r.known(),
      c == r.step_begin ? ", and this step wrote its state in place" : ""));
}

int32_t StateGroup::LiveAfter(const StateSlot& ss, const Request& r, int64_t c) const {
  if (c == r.step_end) return ss.write;
  int32_t live = ss.live;
  for (const StateSnapshot& s : ss.snaps) {
    if (s.position == c) live = s.slot;
  }
  return live;
}

void StateGroup::SettleSnapshots(StateSlot& ss, const Request& r, int64_t c, int64_t publish_limit,
                                 int32_t live) {
  std::vector<int32_t>& to_release = core_.to_release;
  for (const StateSnapshot& s : ss.snaps) {
    if (s.slot == live) continue;
    if (s.position <= publish_limit && core_.IsCheckpoint(r, s.position)) {
      core_.PublishBlock(pool(), s.slot, Key(r, s.position), r, s.position);
      to_release.push_back(s.slot);
    } else if (core_.config.enable_prefix_caching && s.position <= publish_limit &&
               s.position % core_.RollingStride(r) == 0 && s.position > ss.rolling.position) {
      if (ss.rolling.block != BlockPool::kNullBlock) to_release.push_back(ss.rolling.block);
      ss.rolling = {s.position, s.slot};
    } else if (s.position < c) {
      ss.held.push_back({s.position, s.slot});
    } else {
      to_release.push_back(s.slot);
    }
  }
}

void StateGroup::Commit(Request& r, int64_t c, int64_t publish_limit) {
  StateSlot& ss = slot_at(r.slot);
  const int32_t old_live = ss.live;
  const int32_t live = LiveAfter(ss, r, c);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  SettleSnapshots(ss, r, c, publish_limit, live);
  if (ss.write != old_live && ss.write != live) to_release.push_back(ss.write);
  if (old_live != live && old_live != BlockPool::kNullBlock) to_release.push_back(old_live);
  ss.live = live;
  ss.snaps.clear();
  ss.read = ss.write = BlockPool::kNullBlock;
  // An aligned, known position: a checkpoint is published; any other is kept as the rolling
  // state (a second reference, so the next step writes elsewhere), to be published when the
  // request ends.
  if (core_.config.enable_prefix_caching && c > 0 && c % core_.align == 0 && c <= publish_limit &&
      live != BlockPool::kNullBlock && !block_pool().has_identity(live)) {
    if (core_.IsCheckpoint(r, c)) {
      core_.PublishBlock(pool(), live, Key(r, c), r, c);
    } else if (ss.rolling.block != live && c % core_.RollingStride(r) == 0) {
      if (ss.rolling.block != BlockPool::kNullBlock) to_release.push_back(ss.rolling.block);
      ss.rolling = {c, live};
      core_.AcquireHeld(pool(), live);
    }
  }
  core_.Release(pool(), to_release, r.retention);
  // After the release: a demoted checkpoint may be one this step just freed.
  DemoteBeyondCap(r, r.step_begin, publish_limit);
}

void StateGroup::Truncate(Request& r, int64_t x, int64_t) {
  StateSlot& ss = slot_at(r.slot);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  if (x != r.computed && x > 0) {
    int32_t live = BlockPool::kNullBlock;
    auto held = std::find_if(ss.held.begin(), ss.held.end(),
                             [&](const HeldState& h) { return h.position == x; });
    if (held != ss.held.end()) {
      live = held->block;  // the held reference becomes the live one
      ss.held.erase(held);
    } else if (ss.rolling.block != BlockPool::kNullBlock && ss.rolling.position == x) {
      live = ss.rolling.block;
      core_.AcquireHeld(pool(), live);
    } else {
      live = block_pool().Find(Key(r, x));
      core_.AcquireHeld(pool(), live);
    }
    if (ss.live != BlockPool::kNullBlock) to_release.push_back(ss.live);
    ss.live = live;
  } else if (x == 0) {
    // Back to the zero state, whatever snapshot of position 0 a step may have taken.
    if (ss.live != BlockPool::kNullBlock) to_release.push_back(ss.live);
    ss.live = BlockPool::kNullBlock;
  }
  for (const HeldState& h : ss.held)
    to_release.push_back(h.block);
  ss.held.clear();
  if (ss.rolling.block != BlockPool::kNullBlock && ss.rolling.position > x) {
    to_release.push_back(ss.rolling.block);
    ss.rolling = {};
  }
  core_.Release(pool(), to_release, r.retention);
}

void StateGroup::Fork(const Request& parent, int32_t child_slot) {
  StateSlot& cs = slot_at(child_slot);
  cs = slot_at(parent.slot);
  // Shared states are never written in place: the next step of either request writes to a fresh
  // block, which is the copy-on-write of the recurrent state.
  cs.read = cs.write = 0;
  cs.snaps.clear();
  if (cs.live != BlockPool::kNullBlock) core_.AcquireHeld(pool(), cs.live);
  if (cs.rolling.block != BlockPool::kNullBlock) core_.AcquireHeld(pool(), cs.rolling.block);
  for (const HeldState& h : cs.held)
    core_.AcquireHeld(pool(), h.block);
}

void StateGroup::Free(Request& r) {
  StateSlot& ss = slot_at(r.slot);
  // The states worth keeping for another request: the final one if it sits on an aligned, known
  // position, and the rolling one.
  const int64_t c = r.computed;
  int64_t live_position = 0;
  if (ss.live != BlockPool::kNullBlock && c > 0 && c % core_.align == 0 && c <= r.known() &&
      c <= r.publish_until && !r.step_open) {
    core_.PublishBlock(pool(), ss.live, Key(r, c), r, c);
    live_position = c;
  }
  if (ss.rolling.block != BlockPool::kNullBlock) {
    core_.PublishBlock(pool(), ss.rolling.block, Key(r, ss.rolling.position), r,
                       ss.rolling.position);
  }
  const int64_t rolling_position = ss.rolling.position;
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (const StateSnapshot& s : ss.snaps)
    to_release.push_back(s.slot);
  if (r.step_open && ss.write != ss.live) to_release.push_back(ss.write);
  for (auto it = ss.held.rbegin(); it != ss.held.rend(); ++it)
    to_release.push_back(it->block);
  to_release.push_back(ss.live);
  to_release.push_back(ss.rolling.block);
  std::erase(to_release, BlockPool::kNullBlock);
  core_.Release(pool(), to_release, r.retention);
  DemoteSupersededCheckpoints(r, live_position, rolling_position);
  ss.Clear();
}

void StateGroup::Abandon(Request& r) {
  // Only the first step's holdings exist: the hit state or load target and the step's blocks.
  StateSlot& ss = slot_at(r.slot);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (const StateSnapshot& s : ss.snaps)
    to_release.push_back(s.slot);
  if (r.step_open && ss.write != ss.live) to_release.push_back(ss.write);
  to_release.push_back(ss.live);
  std::erase(to_release, BlockPool::kNullBlock);
  core_.Release(pool(), to_release, r.retention);
  ss.Clear();
}

void StateGroup::GiveBackRolling(Request& q, bool allocating, std::vector<GivenBack>& out) {
  StateSlot& ss = slot_at(q.slot);
  const HeldState rolling = ss.rolling;
  if (rolling.block == BlockPool::kNullBlock) return;
  const bool is_live = rolling.block == ss.live;
  if (is_live && !allocating) return;
  // A state of its own stays cached for whoever needs that prefix next, as Free would have left
  // it (KeepGivenBack); one that is also the live state is dropped, so the step can write it in
  // place.
  out.push_back({static_cast<size_t>(q.slot), group_, static_cast<size_t>(rolling.position),
                 rolling.block, !is_live});
  ss.rolling = {};
  core_.ReleaseOne(pool(), rolling.block, q.retention);
}

void StateGroup::RestoreGivenBack(const GivenBack& g) {
  // Nothing was allocated in between, so the block still holds the state.
  Must(block_pool().Reacquire(g.block));
  slot_at(static_cast<int32_t>(g.slot)).rolling = {static_cast<int64_t>(g.index), g.block};
}

void StateGroup::KeepGivenBack(const Request& q, const GivenBack& g) {
  // A block another request still holds (a fork's shared state, perhaps its live one, which the
  // plan may let it write in place) stays as that holder has it; with two-level memory the
  // reservation may have handed its slab to another class.
  const BlockPool& bp = block_pool();
  if (!g.publish || !core_.config.enable_prefix_caching || bp.ref_count(g.block) > 0 ||
      bp.has_identity(g.block) || !bp.segment_owned(bp.segment_of(g.block))) {
    return;
  }
  // Free and intact: the allocation has reserved, not yet drawn. Publishing needs a holder, so
  // the block is held for the moment it takes, and freed again as Free would free it.
  const auto position = static_cast<int64_t>(g.index);
  Must(block_pool().Reacquire(g.block));
  core_.PublishBlock(pool(), g.block, Key(q, position), q, position);
  core_.ReleaseOne(pool(), g.block, q.retention);
}

void StateGroup::Remap(int32_t slot, std::span<const int32_t> moved_to) {
  const auto remap = [&](int32_t& b) {
    if (b != BlockPool::kNullBlock && moved_to[static_cast<size_t>(b)] != BlockPool::kNullBlock) {
      b = moved_to[static_cast<size_t>(b)];
    }
  };
  StateSlot& ss = slot_at(slot);
  remap(ss.live);
  remap(ss.rolling.block);
  for (HeldState& h : ss.held)
    remap(h.block);
}

Status StateGroup::CheckRequest(const Request& r, std::vector<int32_t>& refs) const {
  const StateSlot& ss = slot_at(r.slot);
  const int32_t g = group_;
  if ((ss.live == BlockPool::kNullBlock) != (r.computed == 0)) {
    return Fail(r, fmt::format("group {} live state {} with {} computed", g, ss.live, r.computed));
  }
  if (ss.live != BlockPool::kNullBlock) HKV_RETURN_IF_ERROR(Hold(r, refs, ss.live, "live state"));
  if (ss.rolling.block != BlockPool::kNullBlock) {
    HKV_RETURN_IF_ERROR(Hold(r, refs, ss.rolling.block, "rolling state"));
    if (ss.rolling.position > r.computed || ss.rolling.position % core_.align != 0) {
      return Fail(r, fmt::format("group {} rolling state at {}", g, ss.rolling.position));
    }
  }
  for (const HeldState& h : ss.held)
    HKV_RETURN_IF_ERROR(Hold(r, refs, h.block, "held state"));
  if (r.step_open) {
    if (ss.read != ss.live) return Fail(r, fmt::format("group {} reads a stale state", g));
    if (ss.write != ss.live) HKV_RETURN_IF_ERROR(Hold(r, refs, ss.write, "write state"));
    for (const StateSnapshot& s : ss.snaps)
      HKV_RETURN_IF_ERROR(Hold(r, refs, s.slot, "snapshot"));
  }
  // A state published by this request or, after a Fork, by a co-holder with the same tokens.
  // Past the known tokens there is no digest to compare with.
  const BlockPool& bp = block_pool();
  if (r.computed <= r.known() && bp.has_identity(ss.live) &&
      bp.identity(ss.live) != Key(r, r.computed)) {
    return Fail(r, fmt::format("group {} live state carries a foreign identity", g));
  }
  return Status::Ok();
}

bool StateGroup::HoldsLoadTarget(const Request& r, const BlockLoad& l) const {
  return l.state && slot_at(r.slot).live == l.block;
}

StateStep StateGroup::StepState(int32_t slot) const {
  const StateSlot& ss = slot_at(slot);
  return StateStep{ss.read, ss.write, ss.snaps};
}

// ---- retention ------------------------------------------------------------------------------

bool StateGroup::DemoteCheckpoint(const Request& r, int64_t p) {
  BlockPool& bp = block_pool();
  const int32_t b = bp.Find(Key(r, p));
  // Held means some request is about to read it (or holds it as its own state): leave it.
  if (b <= BlockPool::kNullBlock || bp.ref_count(b) != 0) return false;
  Must(bp.Demote(b));
  return true;
}

void StateGroup::DemoteBeyondCap(const Request& r, int64_t begin, int64_t end) {
  const ManagerConfig& config = core_.config;
  const int64_t interval = config.checkpoint_interval;
  const int64_t cap = config.max_interval_checkpoints;
  if (!config.demote_superseded_checkpoints || !config.enable_prefix_caching || interval == 0 ||
      cap == 0) {
    return;
  }
  for (int64_t p = (begin / interval + 1) * interval; p <= end; p += interval) {
    const int64_t old = p - cap * interval;
    if (old > r.own_from && core_.IsIntervalOnly(r, old)) DemoteCheckpoint(r, old);
  }
}

void StateGroup::DemoteSupersededCheckpoints(const Request& r, int64_t live_position,
                                             int64_t rolling_position) {
  const ManagerConfig& config = core_.config;
  if (!config.demote_superseded_checkpoints || !config.enable_prefix_caching) return;
  // The request's final state: the newest of the live one (published at an aligned end), the
  // rolling one, and the checkpoints its steps passed.
  const int64_t reached = std::min(r.computed, r.known());
  const int64_t interval = config.checkpoint_interval;
  const int64_t prompt_ckpt = core_.PromptCheckpoint(r);
  int64_t final_position = std::max(live_position, rolling_position);
  if (interval > 0) final_position = std::max(final_position, reached / interval * interval);
  if (prompt_ckpt <= reached) final_position = std::max(final_position, prompt_ckpt);
  if (r.divergence <= reached) final_position = std::max(final_position, r.divergence);
  const auto demote = [&](int64_t p) {
    if (p > r.own_from && p < final_position && p != r.divergence) DemoteCheckpoint(r, p);
  };
  demote(prompt_ckpt);
  demote(rolling_position);
  // The checkpoint the request's hit started from, which another request published (a previous
  // turn's end), is superseded as well unless it is a branch point or another cached prefix
  // continues from it: only a request leaving this path at that very point could still need it.
  const int64_t h = r.own_from;
  if (core_.cover && h > 0 && h < final_position && h != r.divergence && h % core_.align == 0) {
    const BlockHash& digest = core_.HashAt(r, h);
    if (!core_.coverage.IsBranch(digest) && core_.coverage.Children(digest) <= 1 &&
        DemoteCheckpoint(r, h)) {
      ++core_.stats.superseded_hits_demoted;
    }
  }
  if (interval == 0) return;
  // Older interval checkpoints were demoted by the cap while the request ran.
  int64_t lo = r.own_from;
  if (config.max_interval_checkpoints > 0) {
    lo = std::max(lo, final_position - (config.max_interval_checkpoints + 1) * interval);
  }
  for (int64_t p = (lo / interval + 1) * interval; p < final_position; p += interval)
    demote(p);
}

}  // namespace hkv::manager_internal
