// CheckInvariants: recounts every reference from the requests' own records (each group counting
// what it holds) and compares them with the pools, then checks the arena and compaction scratch.
#include <algorithm>

#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Status KvCacheManager::Impl::CheckRequest(const Request& r,
                                          std::vector<std::vector<int32_t>>& refs) const {
  const auto fail = [&](const std::string& what) {
    return Status::FailedPrecondition(fmt::format("invariant: request {}: {}", r.id, what));
  };
  if (r.computed > r.reserved) {
    return fail(fmt::format("computed {} beyond reserved {}", r.computed, r.reserved));
  }
  if (static_cast<int64_t>(r.hashes.size()) != r.known() / core.hash_tokens) {
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
    const BlockPool& bp = core.pools[static_cast<size_t>(l.pool)];
    if (!group(static_cast<size_t>(l.group)).HoldsLoadTarget(r, l) || bp.has_identity(l.block) ||
        bp.ref_count(l.block) != 1) {
      return fail(fmt::format("load target block {} of group {} is not a private block it holds",
                              l.block, l.group));
    }
  }
  for (const auto& g : groups)
    HKV_RETURN_IF_ERROR(g->CheckRequest(r, refs[static_cast<size_t>(g->pool())]));
  return Status::Ok();
}

Status KvCacheManager::Impl::CheckInvariants() const {
  const std::vector<BlockPool>& pools = core.pools;
  std::vector<std::vector<int32_t>> expected(pools.size());
  for (size_t p = 0; p < pools.size(); ++p) {
    expected[p].assign(static_cast<size_t>(pools[p].num_blocks()), 0);
  }
  int32_t live_requests = 0, started = 0;
  for (size_t slot = 0; slot < requests.size(); ++slot) {
    if (!Live(slot)) continue;  // a recycled, free slot
    ++live_requests;
    const Request& r = requests[slot];
    if (r.started) ++started;
    HKV_RETURN_IF_ERROR(CheckRequest(r, expected));
    // A kept free-step answer promises that the groups would say as much now.
    if (HasFreeSteps(r) && r.free_until > FreeStepsUntil(r)) {
      return Status::FailedPrecondition(fmt::format(
          "invariant: request {}: kept free steps until {}, but its groups now free only until {} "
          "(a change did not forget them)",
          r.id, r.free_until, FreeStepsUntil(r)));
    }
  }
  if (live_requests != index.size()) {
    return Status::FailedPrecondition(fmt::format(
        "invariant: {} requests indexed, {} found in slots", index.size(), live_requests));
  }
  if (started != started_requests) {
    return Status::FailedPrecondition(
        fmt::format("invariant: {} requests counted as started (the admission headroom's running "
                    "requests), {} found in slots",
                    started_requests, started));
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
  HKV_RETURN_IF_ERROR(core.CheckCoverage());
  if (core.guard != nullptr && !core.guard->CheckInvariants()) {
    return Status::FailedPrecondition(
        "invariant: thrash guard: a remembered chain end is not indexed at its ring slot, or the "
        "index names an end the ring does not hold");
  }
  if (core.arena.num_slabs() > 0) {
    Status s = core.arena.CheckInvariants(pools);
    if (!s.ok()) return Status::FailedPrecondition(fmt::format("invariant: {}", s.message()));
  }
  return Status::Ok();
}

}  // namespace hkv
