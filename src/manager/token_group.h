// TokenGroup: what every group whose table follows decoder positions shares - a block table per
// request, hits that acquire cached blocks, copy-on-write of a shared block before it is
// written, publishing full blocks of known tokens at Commit, cutting back at Truncate.
//
// Which blocks a group needs to continue computing at a position is its kind's one rule
// (Needed): full attention all of them, a window or chunk only the last span (and sinks).
// FullAttentionGroup and WindowGroup supply it and their own hit search.
//
// Private to src/manager.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "group_manager.h"

namespace hkv::manager_internal {

struct TokenSlot {
  std::vector<int32_t> table;  // null for positions the group no longer (or never) keeps
  int32_t num_published = 0;   // leading blocks already offered to the prefix index
  int32_t release_from = 0;    // window/chunk: blocks in [sink blocks, release_from) are null
  // Full attention after Evict (sparse KV): positions dropped from the table, which then
  // indexes cache slots (slot = position - evicted for the positions computed since).
  int64_t evicted = 0;
  // Entries before this are as the engine last took them (TakeDelta).
  int32_t dirty_from = 0;
  // Before the first Allocate: the blocks the last Lookup found for the leading blocks of the
  // prompt (-1: found only in an external store), valid while the pool's identity_epoch() is
  // found_epoch. The first Allocate's plan reads them instead of probing the index again: an
  // engine asks Lookup and Allocate back to back, and a waiting request refused every step
  // would otherwise probe its whole hit twice per step.
  std::vector<int32_t> found;
  uint64_t found_epoch = 0;
  // ManagerConfig::publish_at_allocate: blocks [ahead_from, num_published) were published when
  // the open step was allocated (kNoAhead: none).
  static constexpr int32_t kNoAhead = INT32_MAX;
  int32_t ahead_from = kNoAhead;

  void Clear() {
    table.clear();
    num_published = 0;
    release_from = 0;
    evicted = 0;
    dirty_from = 0;
    found.clear();
    ahead_from = kNoAhead;
  }
  // The block holding leading block j's key, from `found` when it still stands.
  int32_t FoundOr(const BlockPool& bp, size_t j, const PrefixKey& key) const {
    if (found_epoch == bp.identity_epoch() && j < found.size() && found[j] >= 0) return found[j];
    return bp.Find(key);
  }
  void Touch(size_t index) { dirty_from = std::min(dirty_from, static_cast<int32_t>(index)); }
};

class TokenGroup : public GroupManager {
 public:
  // Every full block before `cap` the pools do not cache (both kinds scan those).
  void ExternalCandidates(const Request& r, int64_t cap,
                          std::vector<PrefixKey>& out) const override;
  TokenGroup(CacheCore& core, int32_t group)
      : GroupManager(core, group), math_(config().block_tokens) {}

  // The blocks that hold what continuing at position x needs.
  virtual NeededBlocks Needed(int64_t x) const = 0;

  void AddSlot() override { slots_.emplace_back(); }
  void ClearSlot(int32_t slot) override { slot_at(slot).Clear(); }
  int32_t CountLoads(const Request& r, int64_t tokens) const override;
  bool StepIsFree(const Request& r, const StepPlan& s) const override;
  int64_t FreshNeed(const Request& r, const StepPlan& s) const override;
  Status PlanStep(const Request& r, const StepPlan& s, HitPlan& hp, int64_t& need) const override;
  void ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) override;
  void PlaceLoad(Request& r, int64_t index, int32_t block) override;
  void ApplyStep(Request& r, const StepPlan& s) override;
  void Commit(Request& r, int64_t computed, int64_t publish_limit) override;
  void PublishAhead(Request& r, int64_t limit) override;
  bool LentPast(const Request& r, int64_t limit, int64_t& block) const override;
  void WithdrawAhead(Request& r, int64_t limit) override;
  void Truncate(Request& r, int64_t x, int64_t new_known) override;
  void Fork(const Request& parent, int32_t child_slot) override;
  void CollectForRelease(Request& r, std::vector<std::pair<int64_t, int32_t>>& out) override;
  void Free(Request& r) override;
  void Abandon(Request& r) override;
  void Remap(int32_t slot, std::span<const int32_t> moved_to) override;
  Status CheckRequest(const Request& r, std::vector<int32_t>& refs) const override;
  bool HoldsLoadTarget(const Request& r, const BlockLoad& l) const override;
  std::span<const int32_t> Table(int32_t slot) const override { return slot_at(slot).table; }
  int64_t Evicted(int32_t slot) const override { return slot_at(slot).evicted; }
  std::span<const int32_t> TableAndEvicted(int32_t slot, int64_t& evicted) const override {
    const TokenSlot& ts = slot_at(slot);
    evicted = ts.evicted;
    return ts.table;
  }
  bool TakeDelta(int32_t slot, TableDelta& out) override;
  void TakeInputs(const Request& r, size_t g, StepInputs& out, size_t& at) override;

 protected:
  int64_t block_tokens() const { return config().block_tokens; }
  PrefixKey Key(const Request& r, int64_t block) const { return core_.TokenKey(r, group_, block); }
  TokenSlot& slot_at(int32_t slot) { return slots_[static_cast<size_t>(slot)]; }
  const TokenSlot& slot_at(int32_t slot) const { return slots_[static_cast<size_t>(slot)]; }
  // Releases the whole table, tail first, so the free list evicts a request's tail before its
  // head; then forgets the record.
  void ReleaseTable(Request& r);

  // Whether a step from `begin` writes into a block it must copy first: `begin` is inside a
  // block that is shared or published (PlanStep counts it, ApplyStep makes it).
  bool CopyDue(const TokenSlot& ts, int64_t begin) const;
  // Publishes the table's full blocks from num_published up to position `limit`; `ahead`: at
  // Allocate, before the step computes them (CacheCore::PublishBlock).
  void PublishUpTo(Request& r, TokenSlot& ts, int64_t limit, bool ahead = false);

  // FreeUntil's answer as far as the table and publishing go (TokenGroup::Commit): a kind adds
  // what its own Commit releases. Not FreeUntil itself, so that a kind deriving from TokenGroup
  // answers nothing (every step takes the full path) until it says what its Commit does.
  int64_t TableFreeUntil(const Request& r) const;

  std::vector<TokenSlot> slots_;
  BlockMath math_;  // block_tokens(), for the per-step paths
};

// The slots of table positions [begin, end), every block of which the table holds. One block at
// a time: slots within a block are consecutive.
inline void FillSlots(std::span<const int32_t> table, const BlockMath& bm, int64_t begin,
                      int64_t end, std::span<int64_t> out) {
  const int64_t bs = bm.tokens();
  size_t at = 0;
  for (int64_t p = begin; p < end;) {
    const int64_t block = bm.Block(p);
    const int64_t block_end = std::min(end, (block + 1) * bs);
    int64_t slot = int64_t{table[static_cast<size_t>(block)]} * bs + bm.Offset(p);
    for (; p < block_end; ++p)
      out[at++] = slot++;
  }
}

// Largest x' <= x, a multiple of `unit`, whose needed blocks all satisfy `available`. A miss at
// block j rules out every x' whose needed range contains j, so the search jumps below it; blocks
// are visited once in the window part, from the top down.
template <typename NeededAt, typename Available>
int64_t ScanDown(int64_t bs, int64_t x, int64_t unit, const NeededAt& needed_at,
                 const Available& available) {
  x = x / unit * unit;
  while (x > 0) {
    const NeededBlocks n = needed_at(x);
    int64_t miss = -1;
    for (int64_t j = n.hi - 1; j >= n.lo; --j) {
      if (!available(j)) {
        miss = j;
        break;
      }
    }
    for (int64_t j = 0; miss < 0 && j < n.sinks; ++j) {
      if (!available(j)) miss = j;
    }
    if (miss < 0) return x;
    x = miss * bs / unit * unit;
  }
  return 0;
}

// Full attention: needs every block before the position; the only kind that evicts by policy
// (sparse KV), and the one whose cached reach marks where prefixes branch.
class FullAttentionGroup final : public TokenGroup {
 public:
  using TokenGroup::TokenGroup;

  NeededBlocks Needed(int64_t x) const override;
  void BeginSearch() override { cached_prefix_ = -1; }
  int SearchPass() const override { return 0; }
  int64_t LookupBound(const Request& r, int64_t x, int64_t cap) override;
  bool BranchReach(const Request& r, int64_t cap, int64_t hit, int64_t& reach,
                   bool& held) const override;
  Result<EvictResult> Evict(Request& r, int64_t keep, int64_t unchanged) override;
  int64_t FreeUntil(const Request& r) const override { return TableFreeUntil(r); }

 private:
  // Within one fixed point: cached blocks counted from the front (-1: not yet counted).
  int64_t cached_prefix_ = -1;
};

// Sliding window (with attention sinks) and chunked local attention: needs only the blocks the
// span reaches back to, releases the others at Commit, and keeps those at its request's branch
// point until the request ends (giving them back first when memory is short).
class WindowGroup final : public TokenGroup {
 public:
  WindowGroup(CacheCore& core, int32_t group);

  NeededBlocks Needed(int64_t x) const override;
  void BeginSearch() override { scanned_from_ = -1; }
  int SearchPass() const override { return 1; }
  int64_t LookupBound(const Request& r, int64_t x, int64_t cap) override;
  int64_t TruncateBound(const Request& r, int64_t x, int64_t new_known) const override;
  void Commit(Request& r, int64_t computed, int64_t publish_limit) override;
  int64_t FreeUntil(const Request& r) const override;
  void CollectForRelease(Request& r, std::vector<std::pair<int64_t, int32_t>>& out) override;
  void GiveBackBranch(Request& q, std::vector<GivenBack>& out) override;
  void HoldBranchWindow(Request& r) override;
  void RestoreGivenBack(const GivenBack& g) override;

 private:
  // Within one fixed point: the last scan went down from scanned_from_ to found_ (-1: none yet).
  // The answer for any x in [found_, scanned_from_] is found_ again, so the fixed point's
  // confirming round costs nothing instead of a whole window of probes.
  int64_t scanned_from_ = -1;
  int64_t found_ = 0;
  // CollectForRelease: a request of at most this many spans takes its released blocks back.
  static constexpr int64_t kTakeBackSpans = 3;
  // Whether a full-attention group draws from this group's pool; fixed by the config.
  const bool shares_pool_with_full_attention_;
};

}  // namespace hkv::manager_internal
