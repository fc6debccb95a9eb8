// Truncate, Fork and Free: the operations that cut a request back, share it, or end it.
#include <algorithm>

#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Result<TruncateResult> KvCacheManager::Impl::Truncate(Request& r, int64_t n) {
  if (r.step_open) {
    return Status::FailedPrecondition(
        fmt::format("truncate: request {} has an open step [{}, {}); commit it first", r.id,
                    r.step_begin, r.step_end));
  }
  if (r.publish_until != Request::kNoLimit) {
    return Status::FailedPrecondition(
        fmt::format("truncate: request {} evicted tokens (sparse KV); what it computed since "
                    "depends on them and cannot be rolled back",
                    r.id));
  }
  const int64_t old_known = r.known();
  const int64_t limit = std::max(old_known, r.computed);
  if (n < 0 || n > limit) {
    return Status::InvalidArgument(
        fmt::format("truncate: request {}: cannot keep {} tokens; it has {} (computed {})", r.id, n,
                    old_known, r.computed));
  }
  const int64_t new_known = std::min(old_known, n);
  const int64_t x = TruncateFixedPoint(r, std::min(r.computed, n), new_known);

  // Apply; the fixed point has established that every block and state used below exists.
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const auto g = static_cast<int32_t>(gi);
    const GroupConfig& gc = config.groups[gi];
    BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
    GroupState& gs = r.groups[gi];
    if (IsDecoderTokens(gc)) {
      const int64_t bs = gc.block_tokens;
      const NeededBlocks nb = Needed(g, x);
      for (int64_t j = 0; j < nb.hi; ++j) {
        if (j >= nb.sinks && j < nb.lo) continue;
        int32_t& b = gs.table[static_cast<size_t>(j)];
        if (b != BlockPool::kNullBlock) continue;
        b = bp.Find(TokenKey(r, g, j));
        AcquireHeld(gc.pool, b);
      }
      const auto keep = static_cast<size_t>(CeilDiv(x, bs));
      to_release.clear();
      for (size_t j = gs.table.size(); j > keep; --j) {
        if (gs.table[j - 1] != BlockPool::kNullBlock) to_release.push_back(gs.table[j - 1]);
      }
      gs.table.resize(keep);
      Release(gc.pool, to_release, r.retention);
      gs.num_published =
          std::min<int32_t>(gs.num_published, static_cast<int32_t>(std::min(x, new_known) / bs));
      gs.release_from = std::min<int32_t>(gs.release_from, static_cast<int32_t>(nb.lo));
    } else if (gc.is_state()) {
      to_release.clear();
      int32_t live = gs.live;
      if (x != r.computed && x > 0) {
        live = BlockPool::kNullBlock;
        auto held = std::find_if(gs.held.begin(), gs.held.end(),
                                 [&](const HeldState& h) { return h.position == x; });
        if (held != gs.held.end()) {
          live = held->block;  // the held reference becomes the live one
          gs.held.erase(held);
        } else if (gs.rolling.block != BlockPool::kNullBlock && gs.rolling.position == x) {
          live = gs.rolling.block;
          AcquireHeld(gc.pool, live);
        } else if (x > 0) {
          live = bp.Find(StateKey(r, g, x));
          AcquireHeld(gc.pool, live);
        }
        if (gs.live != BlockPool::kNullBlock) to_release.push_back(gs.live);
        gs.live = live;
      } else if (x == 0) {
        // Back to the zero state, whatever snapshot of position 0 a step may have taken.
        if (gs.live != BlockPool::kNullBlock) to_release.push_back(gs.live);
        gs.live = BlockPool::kNullBlock;
      }
      for (const HeldState& h : gs.held)
        to_release.push_back(h.block);
      gs.held.clear();
      if (gs.rolling.block != BlockPool::kNullBlock && gs.rolling.position > x) {
        to_release.push_back(gs.rolling.block);
        gs.rolling = {};
      }
      Release(gc.pool, to_release, r.retention);
    }
  }
  // Only known tokens are recomputed; drafts past them are simply gone.
  const int64_t recompute = std::max<int64_t>(0, std::min(r.computed, new_known) - x);
  r.tokens.resize(static_cast<size_t>(new_known));
  r.hashes.resize(static_cast<size_t>(new_known / hash_tokens));
  std::erase_if(r.items, [&](const PromptItem& it) { return it.position >= new_known; });
  r.prompt_len = std::min(r.prompt_len, new_known);
  r.computed = x;
  r.reserved = x;
  stats.recomputed_tokens += recompute;
  return TruncateResult{new_known, x, recompute};
}

Status KvCacheManager::Impl::Fork(const Request& parent, RequestId child) {
  if (Find(child) != nullptr) {
    return Status::InvalidArgument(
        fmt::format("fork {} -> {}: the child id is already in use", parent.id, child));
  }
  if (parent.step_open) {
    return Status::FailedPrecondition(fmt::format(
        "fork {} -> {}: the parent has an open step; commit it first", parent.id, child));
  }
  const RequestId parent_id = parent.id;
  const int32_t slot = NewSlot();  // may move `requests`: look the parent up again
  Request& c = requests[static_cast<size_t>(slot)];
  const Request& p = *Find(parent_id);
  // Copy-assignment reuses the recycled slot's buffers; then undo what must not be shared.
  c = p;
  c.id = child;
  c.own_from = p.computed;  // what the parent published stays the parent's to demote
  c.reserved = p.computed;
  c.step_open = false;
  c.step_begin = c.step_end = 0;
  c.copies.clear();
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const GroupConfig& gc = config.groups[gi];
    GroupState& cs = c.groups[gi];
    if (gc.is_state()) {
      // Shared states are never written in place: the next step of either request writes to a
      // fresh block, which is the copy-on-write of the recurrent state.
      cs.read = cs.write = 0;
      cs.snaps.clear();
      if (cs.live != BlockPool::kNullBlock) AcquireHeld(gc.pool, cs.live);
      if (cs.rolling.block != BlockPool::kNullBlock) AcquireHeld(gc.pool, cs.rolling.block);
      for (const HeldState& h : cs.held)
        AcquireHeld(gc.pool, h.block);
      continue;
    }
    // Token tables end at the parent's computed positions (its lookahead stays its own).
    const size_t keep =
        gc.is_encoder() ? cs.table.size()
                        : static_cast<size_t>(CeilDiv(p.computed - cs.evicted, gc.block_tokens));
    cs.table.resize(keep);
    for (int32_t b : cs.table) {
      if (b != BlockPool::kNullBlock) AcquireHeld(gc.pool, b);
    }
    cs.num_published = std::min<int32_t>(cs.num_published, static_cast<int32_t>(keep));
  }
  index.Insert(child, slot);
  return Status::Ok();
}

void KvCacheManager::Impl::ReleaseTokenBlocksCoherently(Request& r) {
  for (size_t p = 0; p < pools.size(); ++p) {
    BlockPool& bp = pools[p];
    release_order.clear();
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const GroupConfig& gc = config.groups[gi];
      if (static_cast<size_t>(gc.pool) != p || !IsDecoderTokens(gc)) continue;
      GroupState& gs = r.groups[gi];
      const int64_t bs = gc.block_tokens;
      for (size_t j = 0; j < gs.table.size(); ++j) {
        int32_t b = gs.table[j];
        if (b == BlockPool::kNullBlock && ReleasesTokens(gc) &&
            j < static_cast<size_t>(gs.num_published)) {
          // Released when it left the window; if it is still cached and nobody holds it, it
          // rejoins the eviction order at its position, next to the other groups' blocks.
          const int32_t cached =
              bp.Find(TokenKey(r, static_cast<int32_t>(gi), static_cast<int64_t>(j)));
          if (cached <= BlockPool::kNullBlock || bp.ref_count(cached) != 0) continue;
          AcquireHeld(gc.pool, cached);
          b = cached;
        }
        if (b != BlockPool::kNullBlock) {
          release_order.emplace_back(static_cast<int64_t>(j + 1) * bs, b);
        }
      }
      gs.table.clear();
    }
    std::stable_sort(release_order.begin(), release_order.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    to_release.clear();
    for (const auto& [end, block] : release_order)
      to_release.push_back(block);
    Release(static_cast<int32_t>(p), to_release, r.retention);
  }
}

void KvCacheManager::Impl::FreeRequest(Request& r) {
  if (config.coherent_eviction) ReleaseTokenBlocksCoherently(r);
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const auto g = static_cast<int32_t>(gi);
    const GroupConfig& gc = config.groups[gi];
    GroupState& gs = r.groups[gi];
    to_release.clear();
    int64_t live_position = 0, rolling_position = 0;
    if (gc.is_state()) {
      // The states worth keeping for another request: the final one if it sits on an aligned,
      // known position, and the rolling one.
      const int64_t c = r.computed;
      if (gs.live != BlockPool::kNullBlock && c > 0 && c % align == 0 && c <= r.known() &&
          c <= r.publish_until && !r.step_open) {
        PublishBlock(gc.pool, gs.live, StateKey(r, g, c), r.id, c);
        live_position = c;
      }
      if (gs.rolling.block != BlockPool::kNullBlock) {
        PublishBlock(gc.pool, gs.rolling.block, StateKey(r, g, gs.rolling.position), r.id,
                     gs.rolling.position);
      }
      rolling_position = gs.rolling.position;
      for (const StateSnapshot& s : gs.snaps)
        to_release.push_back(s.slot);
      if (r.step_open && gs.write != gs.live) to_release.push_back(gs.write);
      for (auto it = gs.held.rbegin(); it != gs.held.rend(); ++it)
        to_release.push_back(it->block);
      to_release.push_back(gs.live);
      to_release.push_back(gs.rolling.block);
      std::erase(to_release, BlockPool::kNullBlock);
    } else {
      // Tail blocks first, so the free list evicts a request's tail before its head.
      for (auto it = gs.table.rbegin(); it != gs.table.rend(); ++it) {
        if (*it != BlockPool::kNullBlock) to_release.push_back(*it);
      }
    }
    Release(gc.pool, to_release, r.retention);
    if (gc.is_state()) DemoteSupersededCheckpoints(r, g, live_position, rolling_position);
    gs.Clear();
  }
  r.tokens.clear();
  r.hashes.clear();
  r.items.clear();
  r.encoder_hashes.clear();
  r.ResetProgress();
}

void KvCacheManager::Impl::AbandonStart(Request& r) {
  // Only the first step's holdings exist: hit blocks (with identities, back to the cache), load
  // targets and the step's own blocks (without, reused first). Nothing was published.
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const GroupConfig& gc = config.groups[gi];
    GroupState& gs = r.groups[gi];
    to_release.clear();
    if (gc.is_state()) {
      for (const StateSnapshot& s : gs.snaps)
        to_release.push_back(s.slot);
      if (r.step_open && gs.write != gs.live) to_release.push_back(gs.write);
      to_release.push_back(gs.live);
      std::erase(to_release, BlockPool::kNullBlock);
    } else {
      for (auto it = gs.table.rbegin(); it != gs.table.rend(); ++it) {
        if (*it != BlockPool::kNullBlock) to_release.push_back(*it);
      }
    }
    Release(gc.pool, to_release, r.retention);
    gs.Clear();
  }
  r.ResetProgress();
  r.computed = 0;
  r.reserved = 0;
  r.encoder_ready = false;
}

}  // namespace hkv
