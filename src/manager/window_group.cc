// WindowGroup: sliding-window (with sinks) and chunked-local attention. Only the blocks the span
// reaches back to are needed; the rest leave at Commit, except those at the request's branch
// point, which stay (as cache others can hit) until the request ends or memory runs short.
#include <algorithm>

#include "token_group.h"

namespace hkv::manager_internal {

namespace {

bool FullAttentionInPool(const ManagerConfig& config, int32_t pool) {
  for (const GroupConfig& gc : config.groups)
    if (gc.pool == pool && gc.rule.kind == TokenRuleKind::kAll) return true;
  return false;
}

}  // namespace

WindowGroup::WindowGroup(CacheCore& core, int32_t group)
    : TokenGroup(core, group),
      shares_pool_with_full_attention_(FullAttentionInPool(core.config, pool())) {}

NeededBlocks WindowGroup::Needed(int64_t x) const {
  const TokenRule& rule = config().rule;
  NeededBlocks n;
  if (x <= 0) return n;
  // Asked at every Commit: block arithmetic without division where the block size allows.
  const int64_t bs = math_.tokens();
  n.hi = math_.Block(x + bs - 1);
  if (rule.kind == TokenRuleKind::kChunk) {
    n.lo = math_.Block(x / rule.span * rule.span);
  } else {
    n.lo = math_.Block(std::max<int64_t>(0, x - rule.span + 1));
    n.sinks = std::min(math_.Block(std::min<int64_t>(rule.sinks, x) + bs - 1), n.lo);
  }
  return n;
}

int64_t WindowGroup::LookupBound(const Request& r, int64_t x, int64_t) {
  // The index does not change during a search, and the largest valid position <= x is found_
  // for every x between found_ and the x that found it.
  if (x >= found_ && x <= scanned_from_) return found_;
  const BlockPool& bp = block_pool();
  scanned_from_ = x;
  return found_ = ScanDown(
             block_tokens(), x, core_.align, [&](int64_t at) { return Needed(at); },
             [&](int64_t j) { return core_.Available(bp, Key(r, j)); });
}

int64_t WindowGroup::TruncateBound(const Request& r, int64_t x, int64_t new_known) const {
  // A block the request still holds is valid up to `computed`; one it released can be taken
  // back from the cache if its identity survived.
  const BlockPool& bp = block_pool();
  const std::vector<int32_t>& table = slot_at(r.slot).table;
  const int64_t bs = block_tokens();
  return ScanDown(
      bs, x, 1, [&](int64_t at) { return Needed(at); },
      [&](int64_t j) {
        if (j < static_cast<int64_t>(table.size()) &&
            table[static_cast<size_t>(j)] != BlockPool::kNullBlock) {
          return true;
        }
        return (j + 1) * bs <= new_known && bp.Find(Key(r, j)) >= 0;
      });
}

void WindowGroup::Commit(Request& r, int64_t c, int64_t publish_limit) {
  TokenGroup::Commit(r, c, publish_limit);
  TokenSlot& ts = slot_at(r.slot);
  // Keep what continuing from min(computed, known) needs, so a Truncate back to the known
  // tokens finds its window intact; everything earlier (but the sinks, and what a hit at the
  // request's branch point needs, kept until it ends) goes.
  // Release follows what the request computed, not what it may publish: after an eviction
  // publishing stops, but the window keeps moving.
  const NeededBlocks nb = Needed(std::min(c, r.known()));
  const int64_t first = std::max<int64_t>(ts.release_from, nb.sinks);
  if (first >= nb.lo) {  // most commits: no block left the window
    ts.release_from = std::max<int32_t>(ts.release_from, static_cast<int32_t>(nb.lo));
    return;
  }
  const NeededBlocks branch = Needed(r.window_branch);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (int64_t j = first; j < nb.lo; ++j) {
    int32_t& b = ts.table[static_cast<size_t>(j)];
    if (b == BlockPool::kNullBlock || (j >= branch.lo && j < branch.hi)) continue;
    to_release.push_back(b);
    b = BlockPool::kNullBlock;
  }
  ts.release_from = std::max<int32_t>(ts.release_from, static_cast<int32_t>(nb.lo));
  std::reverse(to_release.begin(), to_release.end());
  core_.Release(pool(), to_release, r.retention);
}

int64_t WindowGroup::FreeUntil(const Request& r) const {
  const int64_t until = TableFreeUntil(r);
  // Commit at c changes nothing while Needed(c).lo <= release_from: no block leaves the span.
  const TokenRule& rule = config().rule;
  const int64_t bs = math_.tokens();
  const int64_t past = (int64_t{slot_at(r.slot).release_from} + 1) * bs;  // first block not kept
  const int64_t last =
      rule.kind == TokenRuleKind::kChunk
          ? ((past - 1) / rule.span + 1) * rule.span - 1  // the chunk holding past - 1
          : past + rule.span - 2;                         // c - span + 1 <= past - 1
  return std::min(until, last);
}

void WindowGroup::CollectForRelease(Request& r, std::vector<std::pair<int64_t, int32_t>>& out) {
  // The blocks released mid-way rejoin the order only where that pays: in a pool shared with full
  // attention (so the order interleaves them with its blocks, and a tail evicted from it leaves a
  // shorter hit with its window), for a request of at most kTakeBackSpans spans (so they are a
  // small share of what it caches). Elsewhere they keep their earlier place: re-queued, every
  // window of a long request was cached for hits in its middle, which a next turn does not make
  // (docs/manager.md, "Eviction").
  if (!shares_pool_with_full_attention_ ||
      std::min(r.computed, r.known()) > kTakeBackSpans * config().rule.span) {
    TokenGroup::CollectForRelease(r, out);
    return;
  }
  TokenSlot& ts = slot_at(r.slot);
  BlockPool& bp = block_pool();
  const size_t published = std::min(ts.table.size(), static_cast<size_t>(ts.num_published));
  const auto prefetch = [&](size_t j) {
    if (j < published && ts.table[j] == BlockPool::kNullBlock)
      bp.PrefetchFind(Key(r, static_cast<int64_t>(j)));
  };
  for (size_t j = 0; j < static_cast<size_t>(kFindAhead); ++j)
    prefetch(j);
  for (size_t j = 0; j < ts.table.size(); ++j) {
    prefetch(j + static_cast<size_t>(kFindAhead));
    int32_t b = ts.table[j];
    if (b == BlockPool::kNullBlock && j < published) {
      // Released when it left the window; if it is still cached and nobody holds it, it
      // rejoins the eviction order at its position, next to the other groups' blocks.
      const int32_t cached = bp.Find(Key(r, static_cast<int64_t>(j)));
      if (cached <= BlockPool::kNullBlock || bp.ref_count(cached) != 0) continue;
      core_.AcquireHeld(pool(), cached);
      b = cached;
    }
    if (b != BlockPool::kNullBlock) {
      out.emplace_back(static_cast<int64_t>(j + 1) * block_tokens(), b);
    }
  }
  ts.table.clear();
}

void WindowGroup::GiveBackBranch(Request& q, std::vector<GivenBack>& out) {
  TokenSlot& ts = slot_at(q.slot);
  // What Commit kept: the branch's window below release_from and below what the request itself
  // needs now (the sinks stay regardless).
  const NeededBlocks branch = Needed(q.window_branch);
  const NeededBlocks now = Needed(std::min(q.computed, q.known()));
  const int64_t lo = std::max({branch.lo, branch.sinks, now.sinks});
  const int64_t hi = std::min({branch.hi, int64_t{ts.release_from}, now.lo});
  for (int64_t j = hi - 1; j >= lo; --j) {  // tail first, as a window releases
    int32_t& b = ts.table[static_cast<size_t>(j)];
    if (b == BlockPool::kNullBlock) continue;
    out.push_back({static_cast<size_t>(q.slot), group_, static_cast<size_t>(j), b});
    core_.ReleaseOne(pool(), b, q.retention);
    b = BlockPool::kNullBlock;
  }
}

void WindowGroup::HoldBranchWindow(Request& r) {
  // The hit took only the window before its end; the branch's lies further back, where the
  // table is empty. Blocks the step's fresh allocation evicted are simply gone. A block some
  // request holds is alive without this one (and may be one another request published at its
  // Allocate in this batch, whose Commit a second holder would then constrain): only free ones.
  TokenSlot& ts = slot_at(r.slot);
  const NeededBlocks branch = Needed(r.window_branch);
  const BlockPool& bp = block_pool();
  const int64_t hi = std::min<int64_t>(branch.hi, static_cast<int64_t>(ts.table.size()));
  for (int64_t j = std::max(branch.lo, branch.sinks); j < hi; ++j) {
    int32_t& b = ts.table[static_cast<size_t>(j)];
    if (b != BlockPool::kNullBlock) continue;
    const int32_t cached = bp.Find(Key(r, j));
    if (cached <= BlockPool::kNullBlock || bp.ref_count(cached) != 0) continue;
    core_.AcquireHeld(pool(), cached);
    b = cached;
  }
}

void WindowGroup::RestoreGivenBack(const GivenBack& g) {
  // Nothing was allocated in between, so the block still holds what it held.
  Must(block_pool().Reacquire(g.block));
  slot_at(static_cast<int32_t>(g.slot)).table[g.index] = g.block;
}

}  // namespace hkv::manager_internal
