// TokenGroup: the block-table operations full attention, windows and chunks share.
#include "token_group.h"

#include <algorithm>

#include <fmt/format.h>

namespace hkv::manager_internal {

void TokenGroup::ExternalCandidates(const Request& r, int64_t cap,
                                    std::vector<PrefixKey>& out) const {
  const BlockPool& bp = block_pool();
  const int64_t blocks = cap / block_tokens();
  for (int64_t j = 0; j < blocks; ++j) {
    const PrefixKey k = Key(r, j);
    if (bp.Find(k) < 0) out.push_back(k);
  }
}

int32_t TokenGroup::CountLoads(const Request& r, int64_t tokens) const {
  if (tokens <= 0) return 0;
  const BlockPool& bp = block_pool();
  const NeededBlocks nb = Needed(tokens);
  int32_t loads = 0;
  for (int64_t j = 0; j < nb.hi; ++j) {
    if ((j < nb.sinks || j >= nb.lo) && bp.Find(Key(r, j)) < 0) ++loads;
  }
  return loads;
}

bool TokenGroup::StepIsFree(const Request& r, const StepPlan& s) const {
  if (!s.started) return false;
  const TokenSlot& ts = slot_at(r.slot);
  // The table covers [0, reserve): ceil((reserve - evicted) / bs) <= size, without dividing.
  if (s.reserve - ts.evicted > static_cast<int64_t>(ts.table.size()) * math_.tokens()) {
    return false;
  }
  return !CopyDue(ts, s.begin);
}

int64_t TokenGroup::TableFreeUntil(const Request& r) const {
  const TokenSlot& ts = slot_at(r.slot);
  const BlockPool& bp = block_pool();
  const int64_t bs = math_.tokens();
  // Commit would withdraw what the last Allocate published ahead.
  if (ts.ahead_from != TokenSlot::kNoAhead) return -1;
  // The table's reach: a step ending (with its lookahead) within it allocates nothing.
  int64_t until = static_cast<int64_t>(ts.table.size()) * bs + ts.evicted;
  // The block r.computed falls in is the only one the free steps write: it must be the request's
  // own (a shared or published block is copied first), and they end within it.
  const int64_t k = math_.Block(r.computed - ts.evicted);
  if (k < static_cast<int64_t>(ts.table.size())) {
    const int32_t b = ts.table[static_cast<size_t>(k)];
    if (b == BlockPool::kNullBlock || bp.ref_count(b) > 1 || bp.has_identity(b)) return -1;
    until = std::min(until, (k + 1) * bs + ts.evicted);
  }
  // A step (or Commit) reaching the end of the next unpublished block publishes it.
  if (ts.evicted == 0) until = std::min(until, (int64_t{ts.num_published} + 1) * bs - 1);
  return until;
}

bool TokenGroup::CopyDue(const TokenSlot& ts, int64_t begin) const {
  if (math_.Offset(begin - ts.evicted) == 0) return false;
  const BlockPool& bp = block_pool();
  const int32_t b = ts.table[static_cast<size_t>(math_.Block(begin - ts.evicted))];
  return bp.ref_count(b) > 1 || bp.has_identity(b);
}

Status TokenGroup::PlanStep(const Request& r, const StepPlan& s, HitPlan& hp, int64_t& need) const {
  const BlockPool& bp = block_pool();
  const TokenSlot& ts = slot_at(r.slot);
  const int64_t bs = block_tokens();
  int64_t have = static_cast<int64_t>(ts.table.size());
  if (!s.started && s.begin > 0) {
    const NeededBlocks nb = Needed(s.begin);
    for (int64_t j = nb.First(); j < nb.hi; j = nb.Next(j)) {
      const int32_t b = ts.FoundOr(bp, static_cast<size_t>(j), Key(r, j));
      if (b < 0) {
        if (!hp.TakeLoad(need)) return StaleHit(r, "a KV block");
        continue;
      }
      if (bp.ref_count(b) == 0) {
        ++need;
        core_.hit_keep.push_back({pool(), b});
      }
      hp.blocks.push_back(b);
    }
    have = nb.hi;
  }
  // After Evict the table indexes slots: position p sits in slot p - evicted.
  need += std::max<int64_t>(0, CeilDiv(s.reserve - ts.evicted, bs) - have);
  if (s.started && CopyDue(ts, s.begin)) ++need;
  return Status::Ok();
}

int64_t TokenGroup::FreshNeed(const Request& r, const StepPlan& s) const {
  if (s.started) return -1;
  const TokenSlot& ts = slot_at(r.slot);
  const int64_t have = s.begin > 0 ? Needed(s.begin).hi : static_cast<int64_t>(ts.table.size());
  return std::max<int64_t>(0, CeilDiv(s.reserve - ts.evicted, block_tokens()) - have);
}

void TokenGroup::ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) {
  if (s.begin <= 0) return;
  TokenSlot& ts = slot_at(r.slot);
  const NeededBlocks nb = Needed(s.begin);
  ts.table.assign(static_cast<size_t>(nb.hi), BlockPool::kNullBlock);
  ts.dirty_from = 0;
  for (int64_t j = nb.First(); j < nb.hi; j = nb.Next(j)) {
    const int32_t b = hp.blocks[hp.next++];
    if (b == HitPlan::kLoad) {
      r.loads.push_back(
          {group_, pool(), BlockPool::kNullBlock, Key(r, j), false, j * block_tokens()});
      hp.load_index.push_back(j);
      continue;
    }
    core_.AcquireHeld(pool(), b);
    ts.table[static_cast<size_t>(j)] = b;
  }
  ts.num_published = static_cast<int32_t>(nb.hi);
  ts.release_from = static_cast<int32_t>(nb.lo);
}

void TokenGroup::PlaceLoad(Request& r, int64_t index, int32_t block) {
  TokenSlot& ts = slot_at(r.slot);
  ts.table[static_cast<size_t>(index)] = block;
  ts.Touch(static_cast<size_t>(index));
}

void TokenGroup::ApplyStep(Request& r, const StepPlan& s) {
  TokenSlot& ts = slot_at(r.slot);
  const int64_t bs = block_tokens();
  if (s.started && CopyDue(ts, s.begin)) {
    const auto k = static_cast<size_t>((s.begin - ts.evicted) / bs);
    const int32_t copy = core_.AllocateReserved(pool(), 1)[0];
    r.copies.push_back({group_, ts.table[k], copy});
    ts.table[k] = copy;
    ts.Touch(k);
  }
  const int64_t want = CeilDiv(s.reserve - ts.evicted, bs) - static_cast<int64_t>(ts.table.size());
  if (want > 0) {
    const std::span<const int32_t> fresh = core_.AllocateReserved(pool(), want);
    ts.Touch(ts.table.size());
    ts.table.insert(ts.table.end(), fresh.begin(), fresh.end());
  }
}

void TokenGroup::Commit(Request& r, int64_t, int64_t publish_limit) {
  TokenSlot& ts = slot_at(r.slot);
  if (ts.ahead_from != TokenSlot::kNoAhead) WithdrawAhead(r, publish_limit);
  // A group that evicted tokens indexes slots, which no digest names. Most commits (a decode
  // token inside a block) fill no block: they leave before the division.
  if (ts.evicted > 0 || publish_limit < (int64_t{ts.num_published} + 1) * math_.tokens()) return;
  PublishUpTo(r, ts, publish_limit);
}

void TokenGroup::PublishUpTo(Request& r, TokenSlot& ts, int64_t limit, bool ahead) {
  const int64_t bs = block_tokens();
  const int64_t full = math_.Block(limit);
  // Each publish probes the index where its key hashes, a likely cache miss in a large pool: the
  // keys are known, so the slots a few blocks ahead start loading while this one is published.
  constexpr int64_t kAhead = 4;
  const BlockPool& bp = block_pool();
  if (full - ts.num_published > 1 && core_.config.enable_prefix_caching) {
    for (int64_t j = ts.num_published; j < std::min(full, ts.num_published + kAhead); ++j)
      bp.PrefetchFind(Key(r, j));
  }
  for (int64_t j = ts.num_published; j < full; ++j) {
    if (j + kAhead < full) bp.PrefetchFind(Key(r, j + kAhead));
    const int32_t b = ts.table[static_cast<size_t>(j)];
    if (b != BlockPool::kNullBlock) {
      core_.PublishBlock(pool(), b, Key(r, j), r, j * bs,
                         j > 0 ? ts.table[static_cast<size_t>(j - 1)] : BlockPool::kNullBlock,
                         ahead);
    }
  }
  ts.num_published = std::max<int32_t>(ts.num_published, static_cast<int32_t>(full));
}

void TokenGroup::PublishAhead(Request& r, int64_t limit) {
  TokenSlot& ts = slot_at(r.slot);
  if (ts.evicted > 0 || limit < (int64_t{ts.num_published} + 1) * math_.tokens()) return;
  ts.ahead_from = ts.num_published;
  PublishUpTo(r, ts, limit, /*ahead=*/true);
}

bool TokenGroup::LentPast(const Request& r, int64_t limit, int64_t& block) const {
  const TokenSlot& ts = slot_at(r.slot);
  const BlockPool& bp = block_pool();
  // The lender holds one reference; a fork shares no block the open step writes (Fork waits for
  // Commit, and a shared partial block is copied before the step writes it).
  for (int64_t j = std::max<int64_t>(ts.ahead_from, math_.Block(limit)); j < ts.num_published;
       ++j) {
    const int32_t b = ts.table[static_cast<size_t>(j)];
    if (b != BlockPool::kNullBlock && bp.ref_count(b) > 1) {
      block = j;
      return true;
    }
  }
  return false;
}

void TokenGroup::WithdrawAhead(Request& r, int64_t limit) {
  TokenSlot& ts = slot_at(r.slot);
  if (ts.ahead_from == TokenSlot::kNoAhead) return;
  const int64_t cut = std::max<int64_t>(ts.ahead_from, math_.Block(limit));
  BlockPool& bp = block_pool();
  for (int64_t j = cut; j < ts.num_published; ++j) {
    const int32_t b = ts.table[static_cast<size_t>(j)];
    // Only the identity this request gave it: a block whose key was cached elsewhere got none.
    if (b != BlockPool::kNullBlock && bp.has_identity(b) && bp.identity(b) == Key(r, j))
      Must(bp.Unpublish(b));
  }
  ts.num_published = static_cast<int32_t>(std::min<int64_t>(ts.num_published, cut));
  // The blocks the step did compute: one that stayed private because a free block held its key
  // takes the key over now (BlockPool::Publish), as it would have at Commit.
  for (int64_t j = ts.ahead_from; j < ts.num_published; ++j) {
    const int32_t b = ts.table[static_cast<size_t>(j)];
    if (b != BlockPool::kNullBlock && !bp.has_identity(b)) {
      core_.PublishBlock(pool(), b, Key(r, j), r, j * block_tokens(),
                         j > 0 ? ts.table[static_cast<size_t>(j - 1)] : BlockPool::kNullBlock);
    }
  }
  ts.ahead_from = TokenSlot::kNoAhead;
}

void TokenGroup::Truncate(Request& r, int64_t x, int64_t new_known) {
  BlockPool& bp = block_pool();
  TokenSlot& ts = slot_at(r.slot);
  // What the last Lookup found was for the tokens before the cut, which appends may now replace
  // (FoundOr would hand a later plan blocks of other tokens).
  ts.found.clear();
  const int64_t bs = block_tokens();
  const NeededBlocks nb = Needed(x);
  for (int64_t j = nb.First(); j < nb.hi; j = nb.Next(j)) {
    int32_t& b = ts.table[static_cast<size_t>(j)];
    if (b != BlockPool::kNullBlock) continue;
    b = bp.Find(Key(r, j));
    core_.AcquireHeld(pool(), b);
    ts.Touch(static_cast<size_t>(j));
  }
  const auto keep = static_cast<size_t>(CeilDiv(x, bs));
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (size_t j = ts.table.size(); j > keep; --j) {
    if (ts.table[j - 1] != BlockPool::kNullBlock) to_release.push_back(ts.table[j - 1]);
  }
  ts.table.resize(keep);
  ts.Touch(keep);
  core_.Release(pool(), to_release, r.retention);
  ts.num_published =
      std::min<int32_t>(ts.num_published, static_cast<int32_t>(std::min(x, new_known) / bs));
  ts.release_from = std::min<int32_t>(ts.release_from, static_cast<int32_t>(nb.lo));
}

void TokenGroup::Fork(const Request& parent, int32_t child_slot) {
  TokenSlot& cs = slot_at(child_slot);
  // Copy-assignment reuses the recycled slot's buffers.
  cs = slot_at(parent.slot);
  // Tables end at the parent's computed positions (its lookahead stays its own).
  const auto keep = static_cast<size_t>(CeilDiv(parent.computed - cs.evicted, block_tokens()));
  cs.table.resize(keep);
  cs.dirty_from = 0;  // a new request: the engine has none of it
  for (int32_t b : cs.table) {
    if (b != BlockPool::kNullBlock) core_.AcquireHeld(pool(), b);
  }
  cs.num_published = std::min<int32_t>(cs.num_published, static_cast<int32_t>(keep));
}

void TokenGroup::CollectForRelease(Request& r, std::vector<std::pair<int64_t, int32_t>>& out) {
  TokenSlot& ts = slot_at(r.slot);
  for (size_t j = 0; j < ts.table.size(); ++j) {
    if (ts.table[j] != BlockPool::kNullBlock) {
      out.emplace_back(static_cast<int64_t>(j + 1) * block_tokens(), ts.table[j]);
    }
  }
  ts.table.clear();
}

void TokenGroup::ReleaseTable(Request& r) {
  TokenSlot& ts = slot_at(r.slot);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (auto it = ts.table.rbegin(); it != ts.table.rend(); ++it) {
    if (*it != BlockPool::kNullBlock) to_release.push_back(*it);
  }
  core_.Release(pool(), to_release, r.retention);
  ts.Clear();
}

void TokenGroup::Free(Request& r) {
  ReleaseTable(r);
}

void TokenGroup::Abandon(Request& r) {
  ReleaseTable(r);
}

void TokenGroup::Remap(int32_t slot, std::span<const int32_t> moved_to) {
  TokenSlot& ts = slot_at(slot);
  for (size_t j = 0; j < ts.table.size(); ++j) {
    int32_t& b = ts.table[j];
    if (b != BlockPool::kNullBlock && moved_to[static_cast<size_t>(b)] != BlockPool::kNullBlock) {
      b = moved_to[static_cast<size_t>(b)];
      ts.Touch(j);
    }
  }
}

bool TokenGroup::TakeDelta(int32_t slot, TableDelta& out) {
  TokenSlot& ts = slot_at(slot);
  const auto size = static_cast<int32_t>(ts.table.size());
  out.size = size;
  out.from = std::min(ts.dirty_from, size);
  out.blocks = std::span<const int32_t>(ts.table).subspan(static_cast<size_t>(out.from));
  ts.dirty_from = size;
  return true;
}

void TokenGroup::TakeInputs(const Request& r, size_t g, StepInputs& out, size_t& at) {
  TokenSlot& ts = slot_at(r.slot);
  // The open step's positions are reserved and kept (Allocate made them so, and a step from
  // `computed` on is clear of any eviction shift), so they need none of SlotMapping's checks.
  const auto len = static_cast<size_t>(r.step_end - r.step_begin);
  FillSlots(ts.table, math_, r.step_begin - ts.evicted, r.step_end - ts.evicted,
            std::span<int64_t>(out.slots).subspan(at, len));
  at += len;
  TableDelta& d = out.tables[g];
  d.size = static_cast<int32_t>(ts.table.size());
  d.from = std::min(ts.dirty_from, d.size);
  d.blocks = std::span<const int32_t>(ts.table).subspan(static_cast<size_t>(d.from));
  ts.dirty_from = d.size;
  out.states[g] = {};
}

Status TokenGroup::CheckRequest(const Request& r, std::vector<int32_t>& refs) const {
  const TokenSlot& ts = slot_at(r.slot);
  const BlockPool& bp = block_pool();
  const int64_t bs = block_tokens();
  const int32_t g = group_;
  if (static_cast<int64_t>(ts.table.size()) != CeilDiv(r.reserved - ts.evicted, bs)) {
    return Fail(
        r, fmt::format("group {} table has {} blocks for {} reserved positions ({} evicted)", g,
                       ts.table.size(), r.reserved, ts.evicted));
  }
  if (ts.evicted > 0 &&
      (config().rule.kind != TokenRuleKind::kAll || r.publish_until > r.computed)) {
    return Fail(r, fmt::format("group {} evicted {} tokens but publishes until {} (computed {})", g,
                               ts.evicted, r.publish_until, r.computed));
  }
  const NeededBlocks nb = Needed(std::min(r.computed, r.known()));
  for (size_t j = 0; j < ts.table.size(); ++j) {
    const int32_t b = ts.table[j];
    const auto jj = static_cast<int64_t>(j);
    if (b == BlockPool::kNullBlock) {
      if (jj >= nb.lo || jj < nb.sinks) {
        return Fail(r, fmt::format("group {} lost block {} it still needs", g, j));
      }
      continue;
    }
    HKV_RETURN_IF_ERROR(Hold(r, refs, b, "table entry"));
    // Blocks the request published itself (j < num_published) carry its own digest: only
    // full blocks of known tokens are published, and a published block is never written
    // again. Later blocks may carry an identity too - one a co-holder from a Fork published,
    // or one a Truncate cut into - and are copied before the request writes into them.
    if (jj < ts.num_published && bp.has_identity(b) &&
        ((jj + 1) * bs > r.known() || bp.identity(b) != Key(r, jj))) {
      return Fail(
          r, fmt::format("group {} block {} (pool block {}) carries a foreign identity", g, j, b));
    }
  }
  return Status::Ok();
}

bool TokenGroup::HoldsLoadTarget(const Request& r, const BlockLoad& l) const {
  const std::vector<int32_t>& table = slot_at(r.slot).table;
  return !l.state && std::find(table.begin(), table.end(), l.block) != table.end();
}

}  // namespace hkv::manager_internal
