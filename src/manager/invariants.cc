// CheckInvariants: recounts every reference from the requests' own records and compares them with
// the pools, then checks each request's tables against what its groups must keep.
#include <algorithm>

#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Status KvCacheManager::Impl::CheckInvariants() const {
  std::vector<std::vector<int32_t>> expected(pools.size());
  for (size_t p = 0; p < pools.size(); ++p) {
    expected[p].assign(static_cast<size_t>(pools[p].num_blocks()), 0);
  }
  int32_t live_requests = 0;
  for (size_t slot = 0; slot < requests.size(); ++slot) {
    const Request& r = requests[slot];
    if (index.Find(r.id) != static_cast<int32_t>(slot)) continue;  // a recycled, free slot
    ++live_requests;
    const auto fail = [&](const std::string& what) {
      return Status::FailedPrecondition(fmt::format("invariant: request {}: {}", r.id, what));
    };
    if (r.computed > r.reserved) {
      return fail(fmt::format("computed {} beyond reserved {}", r.computed, r.reserved));
    }
    if (static_cast<int64_t>(r.hashes.size()) != r.known() / hash_tokens) {
      return fail(fmt::format("{} block digests for {} tokens", r.hashes.size(), r.known()));
    }
    if (r.step_open && (r.step_begin != r.computed || r.step_end > r.reserved)) {
      return fail(fmt::format("open step [{}, {}) vs computed {} reserved {}", r.step_begin,
                              r.step_end, r.computed, r.reserved));
    }
    if (!r.loads.empty() && (!r.step_open || r.step_begin == 0)) {
      return fail(fmt::format("{} loads pending outside a hit's first step", r.loads.size()));
    }
    for (const BlockLoad& l : r.loads) {
      // A load target is the request's own, in its place, and unpublished until FinishLoad.
      const GroupState& gs = r.groups[static_cast<size_t>(l.group)];
      const BlockPool& bp = pools[static_cast<size_t>(l.pool)];
      const bool placed =
          l.state ? gs.live == l.block
                  : std::find(gs.table.begin(), gs.table.end(), l.block) != gs.table.end();
      if (!placed || bp.has_identity(l.block) || bp.ref_count(l.block) != 1) {
        return fail(fmt::format("load target block {} of group {} is not a private block it holds",
                                l.block, l.group));
      }
    }
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      const auto g = static_cast<int32_t>(gi);
      const GroupConfig& gc = config.groups[gi];
      const GroupState& gs = r.groups[gi];
      std::vector<int32_t>& refs = expected[static_cast<size_t>(gc.pool)];
      const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
      const auto hold = [&](int32_t b, const char* what) -> Status {
        if (b <= 0 || b >= bp.num_blocks()) {
          return fail(fmt::format("group {} {} is block {}", g, what, b));
        }
        ++refs[static_cast<size_t>(b)];
        return Status::Ok();
      };
      if (gc.is_state()) {
        if ((gs.live == BlockPool::kNullBlock) != (r.computed == 0)) {
          return fail(
              fmt::format("group {} live state {} with {} computed", g, gs.live, r.computed));
        }
        if (gs.live != BlockPool::kNullBlock) HKV_RETURN_IF_ERROR(hold(gs.live, "live state"));
        if (gs.rolling.block != BlockPool::kNullBlock) {
          HKV_RETURN_IF_ERROR(hold(gs.rolling.block, "rolling state"));
          if (gs.rolling.position > r.computed || gs.rolling.position % align != 0) {
            return fail(fmt::format("group {} rolling state at {}", g, gs.rolling.position));
          }
        }
        for (const HeldState& h : gs.held)
          HKV_RETURN_IF_ERROR(hold(h.block, "held state"));
        if (r.step_open) {
          if (gs.read != gs.live) return fail(fmt::format("group {} reads a stale state", g));
          if (gs.write != gs.live) HKV_RETURN_IF_ERROR(hold(gs.write, "write state"));
          for (const StateSnapshot& s : gs.snaps)
            HKV_RETURN_IF_ERROR(hold(s.slot, "snapshot"));
        }
        // A state published by this request or, after a Fork, by a co-holder with the same
        // tokens. Past the known tokens there is no digest to compare with.
        if (r.computed <= r.known() && bp.has_identity(gs.live) &&
            bp.identity(gs.live) != StateKey(r, g, r.computed)) {
          return fail(fmt::format("group {} live state carries a foreign identity", g));
        }
        continue;
      }
      if (gc.is_encoder()) {
        const int64_t want = r.started ? CeilDiv(r.encoder_tokens, gc.block_tokens) : 0;
        if (static_cast<int64_t>(gs.table.size()) != want) {
          return fail(fmt::format("encoder group {} holds {} blocks, expected {}", g,
                                  gs.table.size(), want));
        }
        for (size_t i = 0; i < gs.table.size(); ++i) {
          HKV_RETURN_IF_ERROR(hold(gs.table[i], "encoder block"));
          if (bp.has_identity(gs.table[i]) &&
              bp.identity(gs.table[i]) != PrefixKey{r.encoder_hashes[i], g}) {
            return fail(fmt::format("encoder block {} has a foreign identity", i));
          }
        }
        continue;
      }
      const int64_t bs = gc.block_tokens;
      if (static_cast<int64_t>(gs.table.size()) != CeilDiv(r.reserved - gs.evicted, bs)) {
        return fail(
            fmt::format("group {} table has {} blocks for {} reserved positions ({} evicted)", g,
                        gs.table.size(), r.reserved, gs.evicted));
      }
      if (gs.evicted > 0 && (gc.rule.kind != TokenRuleKind::kAll || r.publish_until > r.computed)) {
        return fail(fmt::format("group {} evicted {} tokens but publishes until {} (computed {})",
                                g, gs.evicted, r.publish_until, r.computed));
      }
      const NeededBlocks nb = Needed(g, std::min(r.computed, r.known()));
      for (size_t j = 0; j < gs.table.size(); ++j) {
        const int32_t b = gs.table[j];
        const auto jj = static_cast<int64_t>(j);
        if (b == BlockPool::kNullBlock) {
          if (jj >= nb.lo || jj < nb.sinks) {
            return fail(fmt::format("group {} lost block {} it still needs", g, j));
          }
          continue;
        }
        HKV_RETURN_IF_ERROR(hold(b, "table entry"));
        // Blocks the request published itself (j < num_published) carry its own digest: only
        // full blocks of known tokens are published, and a published block is never written
        // again. Later blocks may carry an identity too — one a co-holder from a Fork published,
        // or one a Truncate cut into — and are copied before the request writes into them.
        if (jj < gs.num_published && bp.has_identity(b) &&
            ((jj + 1) * bs > r.known() || bp.identity(b) != TokenKey(r, g, jj))) {
          return fail(
              fmt::format("group {} block {} (pool block {}) carries a foreign identity", g, j, b));
        }
      }
    }
  }
  if (live_requests != index.size()) {
    return Status::FailedPrecondition(fmt::format(
        "invariant: {} requests indexed, {} found in slots", index.size(), live_requests));
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    Status s = pools[p].CheckInvariants(expected[p]);
    if (!s.ok()) {
      return Status::FailedPrecondition(fmt::format("invariant: pool {}: {}", p, s.message()));
    }
  }
  for (size_t p = 0; p < moved_to.size(); ++p) {
    for (int32_t b : moved_to[p]) {
      if (b != BlockPool::kNullBlock) {
        return Status::FailedPrecondition(
            fmt::format("invariant: pool {}: Compact left a page mapped to page {}", p, b));
      }
    }
  }
  if (arena.num_slabs() > 0) {
    Status s = arena.CheckInvariants(pools);
    if (!s.ok()) return Status::FailedPrecondition(fmt::format("invariant: {}", s.message()));
  }
  return Status::Ok();
}

}  // namespace hkv
