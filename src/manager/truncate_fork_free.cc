// Truncate, Fork and Free: the operations that cut a request back, share it, or end it.
#include <algorithm>
#include <cassert>
#include <iterator>

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
  for (const auto& g : groups)
    g->Truncate(r, x, new_known);
  // The tokens a Lookup named may now be replaced: its hit no longer speaks for this request.
  r.lookup_tokens = -1;
  // Only known tokens are recomputed; drafts past them are simply gone.
  const int64_t recompute = std::max<int64_t>(0, std::min(r.computed, new_known) - x);
  r.tokens.resize(static_cast<size_t>(new_known));
  r.hashes.resize(static_cast<size_t>(new_known / core.hash_tokens));
  std::erase_if(r.items, [&](const PromptItem& it) { return it.position >= new_known; });
  r.prompt_len = std::min(r.prompt_len, new_known);
  r.computed = x;
  r.reserved = x;
  core.stats.recomputed_tokens += recompute;
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
  c.slot = slot;
  c.own_from = p.computed;  // what the parent published stays the parent's to demote
  c.reserved = p.computed;
  c.step_open = false;
  c.step_begin = c.step_end = 0;
  c.copies.clear();
  for (const auto& g : groups)
    g->Fork(p, slot);
  if (c.started) ++started_requests;
  index.Insert(child, slot);
  return Status::Ok();
}

void KvCacheManager::Impl::ReleaseTokenBlocksCoherently(Request& r) {
  const auto later = [](const auto& a, const auto& b) { return a.first > b.first; };
  for (size_t p = 0; p < core.pools.size(); ++p) {
    // Release order is by end position, latest first, ties in group order. Each group lists its
    // blocks in rising positions (CollectForRelease), so its run reversed is in that order
    // already and the runs only need merging: linear, where a sort was a sixth of Free on
    // gpt-oss-20b. Merging what the earlier groups gave (the first range) with the next run
    // keeps ties in group order: std::merge takes equal elements from its first range first.
    release_order.clear();
    size_t merged = 0;
    for (const auto& g : groups) {
      if (static_cast<size_t>(g->pool()) != p) continue;
      g->CollectForRelease(r, release_order);
      const auto first = release_order.begin() + static_cast<std::ptrdiff_t>(merged);
      assert(std::is_sorted(first, release_order.end(),
                            [](const auto& a, const auto& b) { return a.first < b.first; }));
      std::reverse(first, release_order.end());
      if (merged > 0) {
        release_merged.clear();
        std::merge(release_order.begin(), first, first, release_order.end(),
                   std::back_inserter(release_merged), later);
        std::copy(release_merged.begin(), release_merged.end(), release_order.begin());
      }
      merged = release_order.size();
    }
    std::vector<int32_t>& to_release = core.to_release;
    to_release.clear();
    for (const auto& [end, block] : release_order)
      to_release.push_back(block);
    core.Release(static_cast<int32_t>(p), to_release, r.retention);
  }
}

void KvCacheManager::Impl::FreeRequest(Request& r, FreeReason reason) {
  // What an open step published at Allocate was never computed.
  if (r.step_open) {
    for (manager_internal::GroupManager* g : ahead_publishers)
      g->WithdrawAhead(r, r.computed);
  }
  const Retention retention = r.retention;
  const bool guarded = core.guard != nullptr && r.started;
  if (guarded) GuardFree(r, reason);
  if (config.coherent_eviction) ReleaseTokenBlocksCoherently(r);
  for (const auto& g : groups)
    g->Free(r);
  if (guarded) core.guard->Released(core.GuardNow(), reason == FreeReason::kFinished);
  r.retention = retention;
  r.tokens.clear();
  r.hashes.clear();
  r.items.clear();
  r.encoder_hashes.clear();
  if (r.started) --started_requests;
  r.ResetProgress();
}

void KvCacheManager::Impl::GuardFree(Request& r, FreeReason reason) {
  // The chain end is the last hash block the request computed: the next turn's prompt holds it,
  // and only computed blocks can have been cached for that turn to hit.
  manager_internal::ThrashGuard& guard = *core.guard;
  guard.Freeing(core.GuardNow());
  const int64_t ends = std::min(r.computed, r.known()) / core.hash_tokens;
  if (ends <= 0) return;
  const uint64_t residence = core.GuardResidence();
  if (reason == FreeReason::kFinished && r.retention == Retention::kNormal &&
      !guard.Keep(r.continued)) {
    r.retention = Retention::kProbation;
    ++core.stats.thrash_probation_frees;
  }
  const bool preempted = reason == FreeReason::kPreempted;
  guard.Freed(r.hashes[static_cast<size_t>(ends - 1)], core.GuardNow(), residence, preempted,
              r.continued);
  if (!preempted) guard.Tick(residence);
  core.stats.thrash_keep_share = guard.keep_share();
}

void KvCacheManager::Impl::AbandonStart(Request& r) {
  // Only the first step's holdings exist: hit blocks (with identities, back to the cache), load
  // targets and the step's own blocks (without, reused first). Nothing was published.
  for (const auto& g : groups)
    g->Abandon(r);
  if (r.started) --started_requests;
  r.ResetProgress();
  r.computed = 0;
  r.reserved = 0;
  r.encoder_ready = false;
}

}  // namespace hkv
