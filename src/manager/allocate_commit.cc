// Allocate and Commit: opening a step (reserving every group's slots, all or nothing) and closing
// it (publishing what became immutable, releasing what left a window, moving the live state).
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "manager_impl.h"

namespace hkv {

namespace {
// Marks a hit block that the first Allocate loads from an external store (no block id is 0 in
// a token table that a hit fills: 0 is the null block, which is never a hit).
constexpr int32_t kLoad = -1;
}  // namespace

// Positions in [begin, end) after which the step must copy the recurrent state aside:
// - checkpoints strictly inside the step (known, aligned, an interval multiple or the prompt end);
// - the last aligned known position inside the step, when the step does not itself end on one,
//   so the rolling state keeps up with multi-token steps (chunked prefill);
// - every speculative position, so that Commit and Truncate can land on any of them.
// The state after `end` is the step's write slot and needs no copy. Each of the first three is a
// split of the step's chunk; at most max_state_splits are kept, the most useful first (a branch
// point others share, what an identical prompt hits, the rolling state, the newest intervals).
void KvCacheManager::Impl::PlanSnapshots(const Request& r, int64_t begin, int64_t end,
                                         int64_t divergence, std::vector<int64_t>& out) const {
  out.clear();
  const int64_t known = r.known();
  // Checkpoints past an eviction could never be published (Commit): none are planned there.
  const int64_t last = std::min({end - 1, known, r.publish_until});
  // Without prefix caching nobody could hit a checkpoint: only speculative states are kept.
  if (config.enable_prefix_caching) {
    const auto splits = static_cast<size_t>(config.max_state_splits);
    const auto add = [&](int64_t p) {
      if (out.size() < splits && std::find(out.begin(), out.end(), p) == out.end())
        out.push_back(p);
    };
    if (divergence > begin && divergence <= last) add(divergence);
    const int64_t prompt_ckpt = PromptCheckpoint(r);
    if (prompt_ckpt > begin && prompt_ckpt <= last) add(prompt_ckpt);
    const int64_t rolling = last / align * align;
    const bool end_rolls = end % align == 0 && end <= known;
    if (rolling > begin && !end_rolls) add(rolling);
    const int64_t interval = config.checkpoint_interval;
    if (interval > 0) {
      for (int64_t p = last / interval * interval; p > begin && out.size() < splits; p -= interval)
        add(p);
    }
  }
  // The state after 0 tokens is the zero state: it needs no copy.
  for (int64_t p = std::max({begin, known, int64_t{1}}); p < end; ++p)
    out.push_back(p);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

Status KvCacheManager::Impl::ReserveBlocks() {
  if (arena.num_slabs() > 0) {
    // Two-level memory: move slabs so every pool can allocate its need (nothing moves when it
    // cannot); the caller then only draws from the pools.
    const Status reserved = arena.Reserve(pools, need, hit_keep);
    // Anything but a shortage means the manager passed the arena bad pools or keeps: a bug,
    // not a reason for the engine to preempt.
    if (reserved.code() != StatusCode::kResourceExhausted) Must(reserved);
    return reserved;
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    if (need[p] > pools[p].num_free()) {
      return Status::ResourceExhausted(
          fmt::format("pool {} needs {} free blocks, has {}", p, need[p], pools[p].num_free()));
    }
  }
  return Status::Ok();
}

Status KvCacheManager::Impl::Allocate(Request& r, int64_t num_new, const PrefixHit& hit,
                                      int64_t lookahead) {
  if (!r.loads.empty()) {
    return Status::FailedPrecondition(fmt::format(
        "allocate: request {} has {} block(s) loading for its first step; call FinishLoad first",
        r.id, r.loads.size()));
  }
  if (r.step_open) {
    return Status::FailedPrecondition(
        fmt::format("allocate: request {} already has an open step [{}, {}); commit it first", r.id,
                    r.step_begin, r.step_end));
  }
  if (num_new < 1) {
    return Status::InvalidArgument(
        fmt::format("allocate: request {}: {} new tokens; expected >= 1", r.id, num_new));
  }
  if (lookahead < 0) {
    return Status::InvalidArgument(
        fmt::format("allocate: request {}: negative lookahead {}", r.id, lookahead));
  }
  if (r.started && (hit.tokens != 0 || hit.encoder || hit.loads != 0)) {
    return Status::FailedPrecondition(fmt::format(
        "allocate: request {}: a prefix hit can only be passed to the first Allocate", r.id));
  }
  if (!r.started) {
    // Each refusal names the one property of the hit that Lookup could not have produced.
    const auto not_from_lookup = [&](const std::string& why) {
      return Status::InvalidArgument(fmt::format(
          "allocate: request {}: hit of {} tokens with {} load(s) is not one Lookup could return: "
          "{}",
          r.id, hit.tokens, hit.loads, why));
    };
    if (hit.tokens < 0) return not_from_lookup("negative tokens");
    if (hit.tokens % align != 0) {
      return not_from_lookup(fmt::format("tokens not a multiple of the alignment {}", align));
    }
    if (hit.loads < 0) return not_from_lookup("negative loads");
    if (hit.loads > 0 && hit.tokens == 0) return not_from_lookup("loads without hit tokens");
    if (hit.tokens > 0 && !config.enable_prefix_caching) {
      return not_from_lookup("hit tokens with prefix caching off");
    }
    if (hit.tokens > 0 && hit.tokens > r.known() - 1) {
      return Status::FailedPrecondition(fmt::format(
          "allocate: request {}: the prefix hit of {} tokens went stale: the request now has {} "
          "tokens; look up again",
          r.id, hit.tokens, r.known()));
    }
    if (hit.encoder && !has_encoder) {
      return Status::InvalidArgument(fmt::format(
          "allocate: request {}: encoder hit on a model without a cross-attention group", r.id));
    }
    if (hit.encoder && !config.enable_prefix_caching) {
      return Status::InvalidArgument(
          fmt::format("allocate: request {}: encoder hit with prefix caching off", r.id));
    }
  }
  const int64_t begin = r.started ? r.computed : hit.tokens;
  // Compared by subtraction: begin + num_new + lookahead may not even be representable.
  if (num_new > config.max_model_len - begin ||
      lookahead > config.max_model_len - begin - num_new) {
    return Status::InvalidArgument(
        fmt::format("allocate: request {}: {} new tokens from position {} with lookahead {} exceed "
                    "max_model_len {}",
                    r.id, num_new, begin, lookahead, config.max_model_len));
  }
  const int64_t end = begin + num_new;
  const int64_t reserve = std::max(r.reserved, end + lookahead);

  // Plan: count what every pool must supply, and check that the hit still stands. Nothing
  // changes until every pool is known to suffice.
  const int64_t divergence = r.started ? r.divergence : DivergenceOf(r, hit.tokens);
  PlanSnapshots(r, begin, end, divergence, positions);
  const int64_t window_branch = r.started ? r.window_branch : WindowBranchOf(r, hit.tokens);
  const auto stale = [&](const char* what) {
    return Status::FailedPrecondition(fmt::format(
        "allocate: request {}: the prefix hit went stale ({} evicted since Lookup); look up "
        "again",
        r.id, what));
  };
  // A hit block missing from the pools is loaded from the external store, as many as the hit
  // planned: a block evicted since Lookup makes the hit stale, as without a store.
  int32_t planned_loads = 0;
  const auto load = [&](int64_t& n) {
    if (++planned_loads > hit.loads) return false;
    ++n;
    hit_blocks.push_back(kLoad);
    return true;
  };
  const auto plan = [&]() -> Status {
    std::fill(need.begin(), need.end(), 0);
    hit_blocks.clear();
    hit_keep.clear();
    planned_loads = 0;
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const auto g = static_cast<int32_t>(gi);
      const GroupConfig& gc = config.groups[gi];
      const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
      const GroupState& gs = r.groups[gi];
      int64_t& n = need[static_cast<size_t>(gc.pool)];
      if (IsDecoderTokens(gc)) {
        const int64_t bs = gc.block_tokens;
        int64_t have = static_cast<int64_t>(gs.table.size());
        if (!r.started && begin > 0) {
          const NeededBlocks nb = Needed(g, begin);
          for (int64_t j = 0; j < nb.hi; ++j) {
            if (j >= nb.sinks && j < nb.lo) continue;
            const int32_t b = bp.Find(TokenKey(r, g, j));
            if (b < 0) {
              if (!load(n)) return stale("a KV block");
              continue;
            }
            if (bp.ref_count(b) == 0) {
              ++n;
              hit_keep.push_back({gc.pool, b});
            }
            hit_blocks.push_back(b);
          }
          have = nb.hi;
        }
        // After Evict the table indexes slots: position p sits in slot p - evicted.
        n += std::max<int64_t>(0, CeilDiv(reserve - gs.evicted, bs) - have);
        if (r.started && (begin - gs.evicted) % bs != 0) {
          const int32_t b = gs.table[static_cast<size_t>((begin - gs.evicted) / bs)];
          if (bp.ref_count(b) > 1 || bp.has_identity(b)) ++n;  // copy-on-write
        }
      } else if (gc.is_encoder()) {
        if (r.started) continue;
        const int64_t blocks = CeilDiv(r.encoder_tokens, gc.block_tokens);
        if (hit.encoder) {
          for (int64_t i = 0; i < blocks; ++i) {
            const int32_t b = bp.Find({r.encoder_hashes[static_cast<size_t>(i)], g});
            if (b < 0) return stale("an encoder block");
            if (bp.ref_count(b) == 0) {
              ++n;
              hit_keep.push_back({gc.pool, b});
            }
            hit_blocks.push_back(b);
          }
        } else {
          n += blocks;
        }
      } else if (gc.is_state()) {
        if (!r.started && begin > 0) {
          const int32_t b = bp.Find(StateKey(r, g, begin));
          if (b < 0) {
            if (!load(n)) return stale("a recurrent checkpoint");
          } else {
            if (bp.ref_count(b) == 0) {
              ++n;
              hit_keep.push_back({gc.pool, b});
            }
            hit_blocks.push_back(b);
          }
        }
        const bool in_place = r.started && gs.live != BlockPool::kNullBlock &&
                              bp.ref_count(gs.live) == 1 && !bp.has_identity(gs.live);
        n += (in_place ? 0 : 1) + static_cast<int64_t>(positions.size());
      }
    }
    return Status::Ok();
  };
  const auto fit = [&]() -> Status {
    const Status reserved = ReserveBlocks();
    if (reserved.ok()) return reserved;
    return Status::ResourceExhausted(
        fmt::format("allocate: request {}: positions [{}, {}) need {} block(s) per pool: {}", r.id,
                    begin, end + lookahead, fmt::join(need, "/"), reserved.message()));
  };
  HKV_RETURN_IF_ERROR(plan());
  Status fits = fit();
  // Windows kept at branch points are cache, not need: short of blocks, they are given back
  // before anything is refused, and taken back when even that is not enough (a refusal changes
  // nothing). Giving back evicts nothing, so the hit still stands on the second plan.
  if (!fits.ok()) {
    given_back.clear();
    given_back_branch.clear();
    // One request's windows at a time, until the allocation fits.
    for (size_t from = 0; !fits.ok() && GiveBackBranchWindows(from);) {
      Must(plan());
      fits = fit();
    }
    if (fits.ok()) {
      stats.branch_blocks_given_back += static_cast<int64_t>(given_back.size());
    } else {
      UndoGiveBack();
    }
  }
  if (!fits.ok()) {
    ++stats.allocations_failed;
    return fits;
  }

  // Apply. Hit blocks are acquired before any fresh allocation so that eviction cannot take
  // them; copy sources and stale snapshots are released last for the same reason.
  if (!r.started) {
    size_t k = 0;
    r.loads.clear();
    load_index.clear();
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const auto g = static_cast<int32_t>(gi);
      const GroupConfig& gc = config.groups[gi];
      GroupState& gs = r.groups[gi];
      if (IsDecoderTokens(gc) && begin > 0) {
        const NeededBlocks nb = Needed(g, begin);
        gs.table.assign(static_cast<size_t>(nb.hi), BlockPool::kNullBlock);
        for (int64_t j = 0; j < nb.hi; ++j) {
          if (j >= nb.sinks && j < nb.lo) continue;
          const int32_t b = hit_blocks[k++];
          if (b == kLoad) {
            r.loads.push_back(
                {g, gc.pool, BlockPool::kNullBlock, TokenKey(r, g, j), false, j * gc.block_tokens});
            load_index.push_back(j);
            continue;
          }
          AcquireHeld(gc.pool, b);
          gs.table[static_cast<size_t>(j)] = b;
        }
        gs.num_published = static_cast<int32_t>(nb.hi);
        gs.release_from = static_cast<int32_t>(nb.lo);
      } else if (gc.is_encoder() && hit.encoder) {
        const int64_t blocks = CeilDiv(r.encoder_tokens, gc.block_tokens);
        for (int64_t i = 0; i < blocks; ++i) {
          const int32_t b = hit_blocks[k++];
          AcquireHeld(gc.pool, b);
          gs.table.push_back(b);
        }
      } else if (gc.is_state() && begin > 0) {
        const int32_t b = hit_blocks[k++];
        if (b == kLoad) {
          r.loads.push_back(
              {g, gc.pool, BlockPool::kNullBlock, StateKey(r, g, begin), true, begin});
          load_index.push_back(-1);
          continue;
        }
        AcquireHeld(gc.pool, b);
        gs.live = b;
      }
    }
    // Load targets come after every hit block is held, so allocating them cannot evict one.
    for (size_t i = 0; i < r.loads.size(); ++i) {
      BlockLoad& l = r.loads[i];
      fresh.clear();
      Must(pools[static_cast<size_t>(l.pool)].Allocate(1, fresh));
      l.block = fresh[0];
      GroupState& gs = r.groups[static_cast<size_t>(l.group)];
      if (load_index[i] >= 0) {
        gs.table[static_cast<size_t>(load_index[i])] = l.block;
      } else {
        gs.live = l.block;
      }
    }
    r.encoder_ready = hit.encoder;
    r.computed = begin;
  }

  r.copies.clear();
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const auto g = static_cast<int32_t>(gi);
    const GroupConfig& gc = config.groups[gi];
    BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
    GroupState& gs = r.groups[gi];
    if (IsDecoderTokens(gc)) {
      const int64_t bs = gc.block_tokens;
      if (r.started && (begin - gs.evicted) % bs != 0) {
        int32_t& b = gs.table[static_cast<size_t>((begin - gs.evicted) / bs)];
        if (bp.ref_count(b) > 1 || bp.has_identity(b)) {
          fresh.clear();
          Must(bp.Allocate(1, fresh));
          r.copies.push_back({g, b, fresh[0]});
          b = fresh[0];
        }
      }
      const int64_t want =
          CeilDiv(reserve - gs.evicted, bs) - static_cast<int64_t>(gs.table.size());
      if (want > 0) {
        fresh.clear();
        Must(bp.Allocate(static_cast<int32_t>(want), fresh));
        gs.table.insert(gs.table.end(), fresh.begin(), fresh.end());
      }
    } else if (gc.is_encoder()) {
      if (r.started || hit.encoder) continue;
      fresh.clear();
      Must(bp.Allocate(static_cast<int32_t>(CeilDiv(r.encoder_tokens, gc.block_tokens)), fresh));
      gs.table.assign(fresh.begin(), fresh.end());
    } else if (gc.is_state()) {
      gs.read = gs.live;
      const bool in_place = r.started && gs.live != BlockPool::kNullBlock &&
                            bp.ref_count(gs.live) == 1 && !bp.has_identity(gs.live);
      fresh.clear();
      Must(bp.Allocate(static_cast<int32_t>(positions.size()) + (in_place ? 0 : 1), fresh));
      size_t k = 0;
      gs.write = in_place ? gs.live : fresh[k++];
      gs.snaps.clear();
      for (int64_t p : positions)
        gs.snaps.push_back({p, fresh[k++]});
    }
  }
  // Releases come last: copy sources, and speculative states kept from the previous step (the
  // request has moved on, so Truncate no longer needs them).
  for (const BlockCopy& c : r.copies) {
    ReleaseOne(config.groups[static_cast<size_t>(c.group)].pool, c.src, r.retention);
  }
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    GroupState& gs = r.groups[gi];
    for (const HeldState& h : gs.held)
      ReleaseOne(config.groups[gi].pool, h.block, r.retention);
    gs.held.clear();
  }
  if (!r.started) r.own_from = begin;
  // A started request keeps its own (a give-back above may have cleared it).
  if (!r.started) r.window_branch = window_branch;
  r.started = true;
  r.divergence = divergence;
  r.step_open = true;
  r.step_begin = begin;
  r.step_end = end;
  r.reserved = reserve;
  return Status::Ok();
}

bool KvCacheManager::Impl::GiveBackBranchWindows(size_t& from_slot) {
  for (; from_slot < requests.size(); ++from_slot) {
    const size_t slot = from_slot;
    Request& q = requests[slot];
    // A request with an open step keeps its table as the engine read it for the step.
    if (q.window_branch == 0 || q.step_open || index.Find(q.id) != static_cast<int32_t>(slot)) {
      continue;
    }
    const size_t before = given_back.size();
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const GroupConfig& gc = config.groups[gi];
      if (!ReleasesTokens(gc)) continue;
      const auto g = static_cast<int32_t>(gi);
      GroupState& gs = q.groups[gi];
      // What Commit kept: the branch's window below release_from and below what the request
      // itself needs now (the sinks stay regardless).
      const NeededBlocks branch = Needed(g, q.window_branch);
      const NeededBlocks now = Needed(g, std::min(q.computed, q.known()));
      const int64_t lo = std::max({branch.lo, branch.sinks, now.sinks});
      const int64_t hi = std::min({branch.hi, int64_t{gs.release_from}, now.lo});
      for (int64_t j = hi - 1; j >= lo; --j) {  // tail first, as a window releases
        int32_t& b = gs.table[static_cast<size_t>(j)];
        if (b == BlockPool::kNullBlock) continue;
        given_back.push_back({slot, g, static_cast<size_t>(j), b});
        ReleaseOne(gc.pool, b, q.retention);
        b = BlockPool::kNullBlock;
      }
    }
    if (given_back.size() > before) {  // one that kept nothing yet keeps its branch point
      given_back_branch.push_back({slot, q.window_branch});
      q.window_branch = 0;
      ++from_slot;
      return true;
    }
  }
  return false;
}

void KvCacheManager::Impl::UndoGiveBack() {
  // Nothing was allocated in between, so every block still holds what it held.
  for (auto it = given_back.rbegin(); it != given_back.rend(); ++it) {
    const GroupConfig& gc = config.groups[static_cast<size_t>(it->group)];
    Must(pools[static_cast<size_t>(gc.pool)].Reacquire(it->block));
    requests[it->slot].groups[static_cast<size_t>(it->group)].table[it->index] = it->block;
  }
  for (const auto& [slot, branch] : given_back_branch)
    requests[slot].window_branch = branch;
  given_back.clear();
  given_back_branch.clear();
}

Status KvCacheManager::Impl::Commit(Request& r, int64_t c) {
  if (!r.loads.empty()) {
    return Status::FailedPrecondition(fmt::format(
        "commit: request {}: {} block(s) of its hit are still loading; call FinishLoad first", r.id,
        r.loads.size()));
  }
  if (!r.step_open) {
    return Status::FailedPrecondition(
        fmt::format("commit: request {} has no open step (call Allocate first)", r.id));
  }
  if (c < r.step_begin || c > r.step_end) {
    return Status::InvalidArgument(
        fmt::format("commit: request {}: computed {} outside the step's [{}, {}]", r.id, c,
                    r.step_begin, r.step_end));
  }
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    if (!config.groups[gi].is_state() || c == r.step_end) continue;
    const GroupState& gs = r.groups[gi];
    const bool snapshot = std::any_of(gs.snaps.begin(), gs.snaps.end(),
                                      [&](const StateSnapshot& s) { return s.position == c; });
    // At the step's begin the read state serves, unless the step overwrote it in place.
    const bool intact_read = c == r.step_begin && gs.write != gs.read;
    if (!snapshot && !intact_read) {
      return Status::InvalidArgument(fmt::format(
          "commit: request {}: no recurrent state after {} tokens (group {}); a step can stop "
          "early only at speculative positions (>= {} known tokens){}",
          r.id, c, gi, r.known(),
          c == r.step_begin ? ", and this step wrote its state in place" : ""));
    }
  }
  const int64_t known = r.known();
  const int64_t publish_limit = std::min({c, known, r.publish_until});
  r.computed = c;
  r.step_open = false;
  r.copies.clear();
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const auto g = static_cast<int32_t>(gi);
    const GroupConfig& gc = config.groups[gi];
    const int32_t pool = gc.pool;
    GroupState& gs = r.groups[gi];
    if (gc.is_encoder()) {
      if (!r.encoder_ready) {
        for (size_t i = 0; i < gs.table.size(); ++i) {
          PublishBlock(pool, gs.table[i], {r.encoder_hashes[i], g}, r.id);
        }
      }
    } else if (IsDecoderTokens(gc)) {
      const int64_t bs = gc.block_tokens;
      // A group that evicted tokens indexes slots, which no digest names.
      const int64_t full = gs.evicted > 0 ? 0 : publish_limit / bs;
      for (int64_t j = gs.num_published; j < full; ++j) {
        const int32_t b = gs.table[static_cast<size_t>(j)];
        if (b != BlockPool::kNullBlock) PublishBlock(pool, b, TokenKey(r, g, j), r.id, j * bs);
      }
      gs.num_published = std::max<int32_t>(gs.num_published, static_cast<int32_t>(full));
      if (ReleasesTokens(gc)) {
        // Keep what continuing from min(computed, known) needs, so a Truncate back to the known
        // tokens finds its window intact; everything earlier (but the sinks, and what a hit at
        // the request's branch point needs, kept until it ends) goes.
        // Release follows what the request computed, not what it may publish: after an
        // eviction publishing stops, but the window keeps moving.
        const NeededBlocks nb = Needed(g, std::min(c, known));
        const NeededBlocks branch = Needed(g, r.window_branch);
        to_release.clear();
        for (int64_t j = std::max<int64_t>(gs.release_from, nb.sinks); j < nb.lo; ++j) {
          int32_t& b = gs.table[static_cast<size_t>(j)];
          if (b == BlockPool::kNullBlock || (j >= branch.lo && j < branch.hi)) continue;
          to_release.push_back(b);
          b = BlockPool::kNullBlock;
        }
        gs.release_from = std::max<int32_t>(gs.release_from, static_cast<int32_t>(nb.lo));
        std::reverse(to_release.begin(), to_release.end());
        Release(pool, to_release, r.retention);
      }
    } else if (gc.is_state()) {
      const int32_t old_live = gs.live;
      int32_t live = old_live;
      if (c == r.step_end) {
        live = gs.write;
      } else {
        for (const StateSnapshot& s : gs.snaps) {
          if (s.position == c) live = s.slot;
        }
      }
      to_release.clear();
      for (const StateSnapshot& s : gs.snaps) {
        if (s.slot == live) continue;
        if (s.position <= publish_limit && IsCheckpoint(r, s.position)) {
          PublishBlock(pool, s.slot, StateKey(r, g, s.position), r.id, s.position);
          to_release.push_back(s.slot);
        } else if (config.enable_prefix_caching && s.position <= publish_limit &&
                   s.position % align == 0 && s.position > gs.rolling.position) {
          if (gs.rolling.block != BlockPool::kNullBlock) to_release.push_back(gs.rolling.block);
          gs.rolling = {s.position, s.slot};
        } else if (s.position < c) {
          gs.held.push_back({s.position, s.slot});
        } else {
          to_release.push_back(s.slot);
        }
      }
      if (gs.write != old_live && gs.write != live) to_release.push_back(gs.write);
      if (old_live != live && old_live != BlockPool::kNullBlock) to_release.push_back(old_live);
      gs.live = live;
      gs.snaps.clear();
      gs.read = gs.write = BlockPool::kNullBlock;
      // An aligned, known position: a checkpoint is published; any other is kept as the
      // rolling state (a second reference, so the next step writes elsewhere), to be published
      // when the request ends.
      if (config.enable_prefix_caching && c > 0 && c % align == 0 && c <= publish_limit &&
          live != BlockPool::kNullBlock && !pools[static_cast<size_t>(pool)].has_identity(live)) {
        if (IsCheckpoint(r, c)) {
          PublishBlock(pool, live, StateKey(r, g, c), r.id, c);
        } else if (gs.rolling.block != live) {
          if (gs.rolling.block != BlockPool::kNullBlock) to_release.push_back(gs.rolling.block);
          gs.rolling = {c, live};
          AcquireHeld(pool, live);
        }
      }
      Release(pool, to_release, r.retention);
      // After the release: a demoted checkpoint may be one this step just freed.
      DemoteBeyondCap(r, g, r.step_begin, publish_limit);
    }
  }
  r.encoder_ready = r.encoder_ready || has_encoder;
  return Status::Ok();
}

}  // namespace hkv
