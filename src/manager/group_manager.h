// GroupManager: how one group of layers, of one kind, keeps a request's KV or state. The
// coordinator (KvCacheManager::Impl) runs every operation as the same sequence of calls over its
// groups in order; each kind answers for its own rule:
// - its hit rule: the largest position at or below x it could continue computing from, with
//   blocks from the prefix index (LookupBound) or with what the request still holds
//   (TruncateBound);
// - what a step needs (PlanStep, which mutates nothing) and taking it (ApplyHit, ApplyStep);
// - what becomes immutable or leaves the group at Commit; Truncate, Fork, Free;
// - its own share of the invariant check (CheckRequest counts the references it holds).
//
// One implementation per kind: FullAttentionGroup, WindowGroup (sliding window and chunked
// local, sinks included), EncoderGroup (cross attention) and StateGroup (recurrent state).
// MakeGroupManager picks the class for a group's rule; adding a kind is one class and one line
// there (docs/ARCHITECTURE.md walks through it).
//
// Private to src/manager. Every group keeps one record per request slot (AddSlot / ClearSlot);
// Request::slot indexes it. Blocks are taken and dropped only through the CacheCore.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cache_core.h"

namespace hkv::manager_internal {

// The first Allocate's hit blocks, planned across groups in group order and taken in the same
// order. A block missing from the pools is loaded from the external store, as many as the hit
// planned (kLoad marks it); one more missing means the hit went stale.
struct HitPlan {
  static constexpr int32_t kLoad = -1;  // no hit block is 0: that is the null block
  std::vector<int32_t> blocks;
  std::vector<int64_t> load_index;  // per load taken, its table index (-1: a state)
  int32_t max_loads = 0;
  int32_t planned_loads = 0;
  size_t next = 0;  // ApplyHit's cursor into blocks

  void Reset(int32_t loads) {
    blocks.clear();
    load_index.clear();
    max_loads = loads;
    planned_loads = 0;
    next = 0;
  }
  // Counts a load against the hit's budget; false when the hit did not plan this many.
  bool TakeLoad(int64_t& need) {
    if (++planned_loads > max_loads) return false;
    ++need;
    blocks.push_back(kLoad);
    return true;
  }
};

// One step as Allocate sees it, the same for every group.
struct StepPlan {
  int64_t begin = 0, end = 0;
  int64_t lookahead = 0;
  int64_t reserve = 0;   // token tables must cover [0, reserve)
  bool started = false;  // not the request's first Allocate
  // An admission that must leave ManagerConfig::admission_headroom_steps of growth for the
  // requests already started (their count is not zero, nor the setting).
  bool headroom = false;
  PrefixHit hit;
  std::span<const int64_t> snapshots;  // positions after which states are copied aside
};

// A window/chunk block a request kept for its branch point, or a rolling recurrent state, given
// back to the cache so that an allocation could fit; UndoGiveBack restores it if that allocation
// fails anyway.
struct GivenBack {
  size_t slot;
  int32_t group;
  size_t index;  // in the group's table; a rolling state's position
  int32_t block;
  bool publish = false;  // a rolling state to publish as a checkpoint once the allocation fits
};

class GroupManager {
 public:
  GroupManager(CacheCore& core, int32_t group);
  virtual ~GroupManager();
  GroupManager(const GroupManager&) = delete;
  GroupManager& operator=(const GroupManager&) = delete;

  int32_t group() const { return group_; }
  int32_t pool() const { return config().pool; }
  const GroupConfig& config() const { return core_.config.groups[static_cast<size_t>(group_)]; }

  // ---- per-request records.
  virtual void AddSlot() = 0;
  virtual void ClearSlot(int32_t slot) = 0;

  // ---- hit search. BeginSearch starts a new fixed point (a group may memoise within one).
  virtual void BeginSearch() {}
  // Where the group is asked in the fixed point (ascending; ties in group order). The answer
  // does not depend on it, the work does: a group whose bound is cheap and tight (full
  // attention counts cached blocks from the front) goes first, so that one that scans down
  // from its x (a window, a state) starts below the prompt's uncached tail instead of probing
  // it block by block. State groups must come after every token group (token_search_groups).
  virtual int SearchPass() const = 0;
  // Largest x' <= x (a multiple of align) from which this group could continue with available
  // blocks; `cap` bounds the whole search. Groups that do not follow decoder positions return x.
  virtual int64_t LookupBound(const Request& r, int64_t x, int64_t cap) = 0;
  // Appends the keys LookupBound may ask an external store about for a search capped at `cap`
  // (those the pools do not cache), so that Lookup asks the store once. A key left out is asked
  // one at a time; none listed is the default.
  virtual void ExternalCandidates(const Request& r, int64_t cap, std::vector<PrefixKey>& out) const;
  // Blocks a hit of `tokens` needs that the pools do not cache (hit.loads).
  virtual int32_t CountLoads(const Request& r, int64_t tokens) const = 0;
  // Whether the encoder's blocks are cached (true for every group without an encoder).
  virtual bool EncoderCached(const Request& r) const;
  // Largest x' <= x this group can return the request to (from what it holds, or from the cache
  // for positions below new_known).
  virtual int64_t TruncateBound(const Request& r, int64_t x, int64_t new_known) const;
  // Full attention: its cached reach for WindowBranchOf (Impl), and whether the hit's last block
  // is held by another request. False for every other kind.
  virtual bool BranchReach(const Request& r, int64_t cap, int64_t hit, int64_t& reach,
                           bool& held) const;

  // ---- Allocate: plan (no mutation) then apply.
  // Whether a started request's step s needs nothing of this group: PlanStep would count no
  // block, ApplyStep would allocate nothing and EndPreviousStep would release nothing. When every
  // group says so (most decode steps), Allocate skips planning and, of the apply, runs only
  // ApplyFreeStep. False unless a kind can tell cheaply.
  virtual bool StepIsFree(const Request& r, const StepPlan& s) const;
  // What ApplyStep still does on a free step (a state group points the step's read and write at
  // the live state it updates in place). Called only for groups that say they do something
  // there (the coordinator lists them once).
  virtual bool WorksOnFreeStep() const { return false; }
  virtual void ApplyFreeStep(Request& r);
  // Decode steps that touch no group skip the groups altogether (Impl::FreeStepsUntil): the
  // largest end e (step end plus lookahead) such that, as things stand, a started request's step
  // from r.computed to any end up to e is free here (StepIsFree), and Commit at any position up
  // to e publishes, releases and changes nothing in this group. It holds while only such steps
  // and their commits happen; the coordinator recomputes it after any other Commit and forgets it
  // on every other change. A value <= r.computed promises nothing, the default: a kind that
  // cannot tell cheaply leaves every step to the full path.
  virtual int64_t FreeUntil(const Request& r) const;
  // A first step's blocks PlanStep would count besides the hit's cached ones (those it finds free
  // add to the need; loads and copies too): a lower bound of its need, from arithmetic alone.
  // -1 when the kind cannot tell (the default), which keeps a refusal on the full plan.
  virtual int64_t FreshNeed(const Request& r, const StepPlan& s) const;
  // Adds what the group must allocate to `need` and its hit blocks to `hp`.
  virtual Status PlanStep(const Request& r, const StepPlan& s, HitPlan& hp,
                          int64_t& need) const = 0;
  // First Allocate: acquires the hit blocks PlanStep listed (and notes loads in r.loads).
  virtual void ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) = 0;
  // Puts the fresh block for load `index` (HitPlan::load_index) where the group reads it.
  virtual void PlaceLoad(Request& r, int64_t index, int32_t block);
  // Allocates the step's blocks (copy-on-write targets into r.copies).
  virtual void ApplyStep(Request& r, const StepPlan& s) = 0;
  // After the step's allocations: releases what the previous step kept only for Truncate.
  // Called only for groups that say they keep such things (the coordinator lists them once).
  virtual bool KeepsPreviousStep() const { return false; }
  virtual void EndPreviousStep(Request& r);

  // ---- Commit, Truncate, Fork, Free.
  // Whether Commit(computed) can close the step there; called only for groups that restrict it.
  virtual bool RestrictsCommit() const { return false; }
  virtual Status CheckCommit(const Request& r, int64_t computed) const;
  virtual void Commit(Request& r, int64_t computed, int64_t publish_limit) = 0;
  // ---- ManagerConfig::publish_at_allocate (token groups; nothing for other kinds).
  // At Allocate: publishes the full blocks below `limit` that the open step completes.
  virtual void PublishAhead(Request& r, int64_t limit);
  // Whether a block the open step published at Allocate, at or past `limit`, is held by another
  // request too (a hit on the open step); its table index into `block`.
  virtual bool LentPast(const Request& r, int64_t limit, int64_t& block) const;
  // Withdraws the identities of the blocks the open step published at Allocate at or past
  // `limit` (their KV was never computed); those below it that stayed private because a free
  // block held their key take it over (BlockPool::Publish). Commit does it itself.
  virtual void WithdrawAhead(Request& r, int64_t limit);
  // Returns the request to x (TruncateBound's fixed point established that it can).
  virtual void Truncate(Request& r, int64_t x, int64_t new_known) = 0;
  virtual void Fork(const Request& parent, int32_t child_slot) = 0;
  // Coherent eviction: appends (end position, block) for every block the request holds (and, for
  // a short request's window in a pool shared with full attention, every block it released
  // mid-way that is still cached, which rejoins the order), in rising positions, and forgets
  // them (docs/manager.md, "Eviction").
  virtual void CollectForRelease(Request& r, std::vector<std::pair<int64_t, int32_t>>& out);
  virtual void Free(Request& r) = 0;
  // FinishLoad(id, false): releases what the request's first Allocate took.
  virtual void Abandon(Request& r) = 0;

  // ---- window/chunk branch points (WindowGroup; nothing for other kinds).
  virtual void GiveBackBranch(Request& q, std::vector<GivenBack>& out);
  // First Allocate, with Request::window_branch inside the hit: hold the blocks a hit there
  // needs that are still cached (window and chunk groups; the rest hold nothing more).
  virtual void HoldBranchWindow(Request&) {}
  // ---- rolling recurrent states (StateGroup; nothing for other kinds): the request's rolling
  // state is cache, not need. `allocating`: q is the request being allocated, whose rolling state
  // shared with its live one would make its step write elsewhere; another request's such state
  // frees nothing now, so it keeps it.
  virtual void GiveBackRolling(Request& q, bool allocating, std::vector<GivenBack>& out);
  virtual void RestoreGivenBack(const GivenBack& g);
  // The allocation fitted: what was given back stays given back (a rolling state is published
  // only now, so that a refusal emits no event).
  virtual void KeepGivenBack(const Request& q, const GivenBack& g);

  // ---- sparse KV (full attention only; other kinds refuse).
  virtual Result<EvictResult> Evict(Request& r, int64_t keep, int64_t unchanged);

  // ---- two-level memory: rewrites every block id the request's record names.
  virtual void Remap(int32_t slot, std::span<const int32_t> moved_to) = 0;

  // ---- checking and views.
  // Adds one to refs[b] for each reference the request holds; an error names what is wrong.
  virtual Status CheckRequest(const Request& r, std::vector<int32_t>& refs) const = 0;
  virtual bool HoldsLoadTarget(const Request& r, const BlockLoad& l) const = 0;
  virtual std::span<const int32_t> Table(int32_t slot) const;
  virtual int64_t Evicted(int32_t slot) const;
  // Both at once, for the per-step slot mapping.
  virtual std::span<const int32_t> TableAndEvicted(int32_t slot, int64_t& evicted) const;
  // The table entries changed since the last call (false: the group keeps no table).
  virtual bool TakeDelta(int32_t slot, TableDelta& out);
  virtual StateStep StepState(int32_t slot) const;
  // TakeStepInputs' share of group `g` for a request with an open step: out.tables[g] (the
  // delta, taken), out.states[g], and - for a group following decoder positions - the step's
  // slots written from out.slots[at] on (`at` advanced past them; out.slots is sized already).
  // One call per group and step: the default composes the views above.
  virtual void TakeInputs(const Request& r, size_t g, StepInputs& out, size_t& at);

 protected:
  BlockPool& block_pool() { return core_.pools[static_cast<size_t>(pool())]; }
  const BlockPool& block_pool() const { return core_.pools[static_cast<size_t>(pool())]; }
  Status Fail(const Request& r, const std::string& what) const;
  Status Hold(const Request& r, std::vector<int32_t>& refs, int32_t block, const char* what) const;
  static Status StaleHit(const Request& r, const char* what);

  CacheCore& core_;
  const int32_t group_;
};

std::unique_ptr<GroupManager> MakeGroupManager(CacheCore& core, int32_t group);

}  // namespace hkv::manager_internal
