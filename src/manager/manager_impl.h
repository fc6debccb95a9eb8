// KvCacheManager::Impl, the coordinator: requests and their ids, and every operation as one
// sequence of calls over the group managers (group_manager.h), each kind answering for its own
// rule. What the coordinator itself decides is what spans groups:
// - the hit: the fixed point over every group's bound (Lookup, Truncate), and the points a
//   request's first Allocate fixes for later (divergence, window branch);
// - all-or-nothing steps: every group plans (nothing changes), the pools are checked once, and
//   only then does every group apply - hit blocks first, load targets, then fresh blocks, and
//   releases last, so no allocation can evict a block the step is about to take;
// - coherent release when a request ends (all groups of a pool in one tail-first order);
// - compaction's remapping, events and statistics.
//
// Private to src/manager.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <hkv/manager/kv_cache_manager.h>

#include "branch_memory.h"
#include "cache_core.h"
#include "group_manager.h"
#include "request_table.h"

namespace hkv {

using manager_internal::CeilDiv;
using manager_internal::Must;
using manager_internal::Request;

struct KvCacheManager::Impl {
  explicit Impl(const ManagerConfig& c);

  // Lookups by id; null when unknown.
  Request* Find(RequestId id) {
    const int32_t slot = index.Find(id);
    return slot < 0 ? nullptr : &requests[static_cast<size_t>(slot)];
  }
  const Request* Find(RequestId id) const {
    const int32_t slot = index.Find(id);
    return slot < 0 ? nullptr : &requests[static_cast<size_t>(slot)];
  }
  Status Unknown(const char* call, RequestId id) const;
  // Whether `slot` holds a live request (recycled slots keep their last id).
  bool Live(size_t slot) const {
    return index.Find(requests[slot].id) == static_cast<int32_t>(slot);
  }
  int32_t NewSlot();
  manager_internal::GroupManager& group(size_t g) { return *groups[g]; }
  const manager_internal::GroupManager& group(size_t g) const { return *groups[g]; }

  // Hit search (hit_search.cc).
  int64_t LookupFixedPoint(const Request& r, int64_t cap, bool token_groups_only = false);
  int32_t CountLoads(const Request& r, int64_t tokens) const;
  bool EncoderCached(const Request& r) const;
  int64_t DivergenceOf(const Request& r, int64_t hit);
  // Request::window_branch for a request about to take `hit` (before it acquires anything); 0
  // without window or chunk groups, full-attention groups, or coherent eviction. Where the cache
  // shows no branch, the largest position of its prefix that `branches` remembers.
  int64_t WindowBranchOf(const Request& r, int64_t hit);
  int64_t TruncateFixedPoint(const Request& r, int64_t x, int64_t new_known) const;

  // Allocate (allocate_commit.cc): validation, planning across groups, the give-back of branch
  // windows when short, then the apply phases.
  Status CheckAllocate(const Request& r, int64_t num_new, const PrefixHit& hit,
                       int64_t lookahead) const;
  Status PlanAllocation(const Request& r, const manager_internal::StepPlan& s);
  // The refusal of a step whose planned need does not fit (need and free blocks per pool). With
  // `at_least`, core.need is ClearlyShort's lower bound (no headroom in it).
  Status Shortfall(const Request& r, const manager_internal::StepPlan& s, bool at_least = false);
  void ApplyFirstStep(Request& r, const manager_internal::StepPlan& s);
  void ApplyStep(Request& r, const manager_internal::StepPlan& s);
  // Marks the planned step [s.begin, s.end) open, reserved to s.reserve; with
  // publish_at_allocate, publishes the full blocks of known tokens it completes.
  void OpenStep(Request& r, const manager_internal::StepPlan& s);
  // A block the open step published at Allocate, at or past position `limit`, that another
  // request holds (it hit the open step): the refusal of `call`, which would withdraw it.
  Status CheckLent(const Request& r, int64_t limit, const char* call) const;
  // Releases the window/chunk blocks the next request from slot `from_slot` on (without an open
  // step) keeps for its branch point (and clears its branch point), appending what it did to
  // given_back; advances from_slot past it; false when no request after from_slot keeps any.
  // UndoGiveBack restores every block, table and branch point recorded since given_back was
  // cleared.
  bool GiveBackBranchWindows(size_t& from_slot);
  // Whether the request in `slot` keeps windows at a branch point that GiveBackBranchWindows may
  // take: a live one without an open step (that keeps its table as the engine read it).
  bool GivesBackBranchWindows(size_t slot) const {
    const Request& q = requests[slot];
    return q.window_branch != 0 && !q.step_open && Live(slot);
  }
  // Releases rolling recurrent states (StateGroup::GiveBackRolling): at from_slot 0 those of `r`
  // itself, then one other live request's at a time; advances from_slot; false when none is left.
  bool GiveBackRollingStates(Request& r, size_t& from_slot);
  void UndoGiveBack();
  // Whether the planned need fits (CacheCore::TryReserveBlocks), giving back what running
  // requests hold as cache (branch windows, then rolling states) one request at a time and
  // planning again until the step fits; a refusal takes every give-back back, so it changes
  // nothing, and returns Shortfall.
  Status FitWithGiveBacks(Request& r, const manager_internal::StepPlan& s);
  // ManagerConfig::admission_headroom_steps: PlanAllocation adds to an admission's need, per
  // pool, what the started requests need for that many more decode steps (`headroom`); a refused
  // admission that would have fitted without it is counted (ManagerStats).
  void AddAdmissionHeadroom();
  void CountHeldForHeadroom(const Request& r, const manager_internal::StepPlan& s);

  // Free steps: most decode steps write one more token into a block the request already owns,
  // and their commits publish and release nothing. After each Commit that went through the
  // groups, the least of every group's FreeUntil is kept in the request (NoteFreeSteps); until
  // then, an Allocate ending within it and the Commit of that step only open and close the step,
  // without visiting a group. A change a group's answer may not follow (Fork, Truncate, Evict;
  // and, not needed but rare, loads, compaction, a cache reset, Rerank) forgets all the answers
  // at once (ForgetFreeSteps). Other requests' steps leave an answer standing: they never share
  // the block a request writes (only Fork does), and give-backs release only blocks behind its
  // window. The invariant checker verifies that every kept answer still holds.
  void NoteFreeSteps(Request& r);
  // A waiting head is retried every step while memory is full. Its refusal is certain from
  // arithmetic when the blocks its first step needs besides its hit (GroupManager::FreshNeed, a
  // lower bound of the plan's need) already exceed a pool's free blocks, nothing could be given
  // back, and its hit is the one its last Lookup found with no identity gone since (so the plan
  // could not have found it stale): then it is refused without the plan, which walks every block
  // of the hit. Fixed pools only (an arena's fit is not per pool). Leaves the bound in core.need
  // for Shortfall(at_least).
  bool ClearlyShort(const Request& r, const manager_internal::StepPlan& s);
  uint64_t IdentityEpochs() const {
    uint64_t sum = 0;
    for (const BlockPool& bp : core.pools)
      sum += bp.identity_epoch();
    return sum;
  }
  int64_t FreeStepsUntil(const Request& r) const;
  void ForgetFreeSteps() { ++fast_epoch; }
  bool HasFreeSteps(const Request& r) const {
    return r.free_epoch == fast_epoch && r.free_until > r.computed;
  }

  // The operations the public calls are built from.
  Result<PrefixHit> Lookup(RequestId id, const ExternalBlocks* ext);
  Status Allocate(Request& r, int64_t num_new, const PrefixHit& hit, int64_t lookahead);
  Status Commit(Request& r, int64_t computed);
  Result<TruncateResult> Truncate(Request& r, int64_t n);
  Result<EvictResult> Evict(Request& r, int32_t group, int64_t keep, int64_t unchanged);
  Status Fork(const Request& parent, RequestId child);
  void FreeRequest(Request& r, FreeReason reason = FreeReason::kFinished);
  // ManagerConfig::thrash_guard at a free: where the request's blocks queue, and its chain end
  // remembered.
  void GuardFree(Request& r, FreeReason reason);
  // FinishLoad(id, false): releases everything the request acquired at its first Allocate.
  void AbandonStart(Request& r);
  // for_pool >= 0: KvCacheManager::CompactFor.
  Result<CompactionResult> Compact(std::span<const int64_t> max_slabs_per_class,
                                   int32_t for_pool = -1);
  void ReleaseTokenBlocksCoherently(Request& r);
  Status CheckInvariants() const;
  // Step's answer for a request with an open step.
  StepInfo StepOf(const Request& r) const {
    StepInfo s;
    s.begin = r.step_begin;
    s.end = r.step_end;
    s.reserved_end = r.reserved;
    s.run_encoder = has_encoder && !r.encoder_ready;
    s.copies = r.copies;
    s.loads = r.loads;
    return s;
  }
  // SlotMapping's work for a request already found (validation included).
  Status MapSlots(const Request& r, int32_t group, int64_t begin, int64_t end,
                  std::span<int64_t> out) const;
  Status CheckRequest(const Request& r, std::vector<std::vector<int32_t>>& refs) const;

  manager_internal::CacheCore core;
  const ManagerConfig& config;  // core.config
  bool has_encoder = false;
  bool has_state_groups = false;
  bool has_token_groups = false;   // groups following decoder positions
  bool has_window_groups = false;  // window or chunk groups
  size_t slot_groups = 0;          // groups following decoder positions: their slots are mapped
  // Free steps (NoteFreeSteps) are kept: no group outside FreeUntil's kinds (state and encoder
  // groups work on every step), and cover off (its drops settle after every Allocate).
  bool free_steps = false;
  uint64_t fast_epoch = 1;
  // Branch points seen, kept past their eviction (ManagerConfig::branch_memory_entries); off
  // without window groups and with two-level memory.
  manager_internal::BranchMemory branches{0};
  std::vector<std::unique_ptr<manager_internal::GroupManager>> groups;
  // Lookup visits token groups before state groups: attention bounds the hit cheaply, and the
  // state group's downward probe then starts from there instead of from the prompt's end.
  std::vector<size_t> search_order;
  size_t token_search_groups = 0;  // the leading part of search_order without state groups
  // The groups that act at EndPreviousStep / CheckCommit (listed once: most groups never do).
  std::vector<manager_internal::GroupManager*> previous_step_keepers, commit_checkers,
      free_step_workers;
  // ManagerConfig::publish_at_allocate: the groups that publish what a step completes when it
  // opens (decoder token groups of a model without recurrent ones; none when it is off).
  std::vector<manager_internal::GroupManager*> ahead_publishers;

  std::vector<Request> requests;  // slots, recycled
  std::vector<int32_t> free_slots;
  // Live requests whose first Allocate happened (Request::started): the running requests an
  // admission's headroom is for.
  int32_t started_requests = 0;
  // ManagerConfig::admission_headroom_steps: per pool, the tokens per block of each decoder token
  // group drawing from it (the groups whose tables grow as a request decodes).
  std::vector<std::vector<int32_t>> growing_block_tokens;
  manager_internal::RequestTable index;

  // Allocate's plan, reused.
  manager_internal::HitPlan hit_plan;
  std::vector<int64_t> positions;  // snapshot positions of the step
  // With events recorded: the tokens of requests freed since the last TakeEvents (Free publishes
  // final states), and of those freed before it, which the events it returned may name; Tokens
  // answers from them once a request is gone.
  std::vector<std::pair<RequestId, std::vector<int32_t>>> freed_tokens, taken_freed_tokens;
  std::vector<int64_t> headroom;  // AddAdmissionHeadroom's blocks per pool
  // FitWithGiveBacks: core.need was last planned with give-backs applied (they are undone now).
  bool need_after_give_backs = false;
  std::vector<manager_internal::GivenBack> given_back;        // FitWithGiveBacks' releases
  std::vector<std::pair<size_t, int64_t>> given_back_branch;  // slot, window_branch it had
  std::vector<std::pair<int64_t, int32_t>> release_order;     // (block end position, block)
  std::vector<std::pair<int64_t, int32_t>> release_merged;    // scratch of its merge
  CompactionPlan compaction;                                  // Compact: the arena's plan, reused
  std::vector<std::vector<int32_t>> moved_to;  // Compact: per pool, page -> new page (0: none)
};

}  // namespace hkv
