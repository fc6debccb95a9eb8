// Allocate and Commit: opening a step (reserving every group's slots, all or nothing) and closing
// it (every group publishes what became immutable and releases what it no longer needs).
#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "manager_impl.h"

namespace hkv {

using manager_internal::StepPlan;

Status KvCacheManager::Impl::CheckAllocate(const Request& r, int64_t num_new, const PrefixHit& hit,
                                           int64_t lookahead) const {
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
  return Status::Ok();
}

namespace {

// Each refusal names the one property of the hit that Lookup could not have produced.
Status CheckHit(const Request& r, const PrefixHit& hit, const ManagerConfig& config, int64_t align,
                bool has_encoder) {
  const auto not_from_lookup = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format(
        "allocate: request {}: hit of {} tokens with {} load(s) is not one Lookup could return: {}",
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
  return Status::Ok();
}

}  // namespace

Status KvCacheManager::Impl::PlanAllocation(const Request& r, const StepPlan& s) {
  std::fill(core.need.begin(), core.need.end(), 0);
  core.hit_keep.clear();
  hit_plan.Reset(s.hit.loads);
  for (const auto& g : groups) {
    HKV_RETURN_IF_ERROR(g->PlanStep(r, s, hit_plan, core.need[static_cast<size_t>(g->pool())]));
  }
  if (s.headroom) AddAdmissionHeadroom();
  return Status::Ok();
}

void KvCacheManager::Impl::CountHeldForHeadroom(const Request& r, const StepPlan& s) {
  // Refused with the headroom in the need, every give-back taken back: would the step have fitted
  // without it, as things stand? Planned again only if the last plan was made with give-backs
  // applied (a hit block given back counts as need); a waiting head refused every step without
  // any give-back pays for no second plan.
  if (need_after_give_backs) Must(PlanAllocation(r, s));
  for (size_t p = 0; p < headroom.size(); ++p)
    core.need[p] -= headroom[p];
  if (core.CanReserveBlocks()) ++core.stats.admissions_held_for_headroom;
}

Status KvCacheManager::Impl::Shortfall(const Request& r, const StepPlan& s, bool at_least) {
  // A waiting head may be refused every step: the message is written into one buffer, one
  // allocation for the Status, not several formatted pieces joined.
  fmt::memory_buffer m;
  const char* least = at_least ? " at least" : "";
  fmt::format_to(std::back_inserter(m),
                 "allocate: request {}: positions [{}, {}) need{} {} block(s) per pool{}", r.id,
                 s.begin, s.end + s.lookahead, least, fmt::join(core.need, "/"),
                 at_least ? " besides the cached blocks of its hit" : "");
  if (s.headroom && !at_least) {
    fmt::format_to(std::back_inserter(m),
                   " (of them {} kept free for the {} running requests' next {} decode steps, "
                   "ManagerConfig::admission_headroom_steps)",
                   fmt::join(headroom, "/"), started_requests, config.admission_headroom_steps);
  }
  // Named after the first pool the plan's need exceeds, as TryReserveBlocks found it short.
  if (core.arena.num_slabs() > 0) {
    fmt::format_to(std::back_inserter(m), ": {}", core.arena_shortage);
  } else {
    size_t p = 0;
    while (p < core.pools.size() && core.need[p] <= core.pools[p].num_free())
      ++p;
    if (p < core.pools.size()) {
      fmt::format_to(std::back_inserter(m), ": pool {} needs{} {} free blocks, has {}", p, least,
                     core.need[p], core.pools[p].num_free());
    } else {
      fmt::format_to(std::back_inserter(m), ": no pool is short now");
    }
  }
  return Status::ResourceExhausted(fmt::to_string(m));
}

void KvCacheManager::Impl::ApplyFirstStep(Request& r, const StepPlan& s) {
  r.loads.clear();
  for (const auto& g : groups)
    g->ApplyHit(r, s, hit_plan);
  // Load targets come after every hit block is held, so allocating them cannot evict one.
  for (size_t i = 0; i < r.loads.size(); ++i) {
    BlockLoad& l = r.loads[i];
    l.block = core.AllocateReserved(l.pool, 1)[0];
    group(static_cast<size_t>(l.group)).PlaceLoad(r, hit_plan.load_index[i], l.block);
  }
  r.encoder_ready = s.hit.encoder;
  r.computed = s.begin;
}

void KvCacheManager::Impl::ApplyStep(Request& r, const StepPlan& s) {
  r.copies.clear();
  for (const auto& g : groups)
    g->ApplyStep(r, s);
  // Releases come last: copy sources, and speculative states kept from the previous step.
  for (const BlockCopy& c : r.copies)
    core.ReleaseOne(group(static_cast<size_t>(c.group)).pool(), c.src, r.retention);
  for (manager_internal::GroupManager* g : previous_step_keepers)
    g->EndPreviousStep(r);
}

Status KvCacheManager::Impl::Allocate(Request& r, int64_t num_new, const PrefixHit& hit,
                                      int64_t lookahead) {
  // A free step (NoteFreeSteps): well formed, and ending within what every group said is free
  // (which is within max_model_len). Compared by subtraction: computed + num_new + lookahead may
  // not be representable.
  if (HasFreeSteps(r) && r.started && !r.step_open && r.loads.empty() && num_new >= 1 &&
      lookahead >= 0 && hit.tokens == 0 && !hit.encoder && hit.loads == 0 &&
      num_new <= r.free_until - r.computed && lookahead <= r.free_until - r.computed - num_new) {
    r.copies.clear();
    r.step_open = true;
    r.step_begin = r.computed;
    r.step_end = r.computed + num_new;
    r.reserved = std::max(r.reserved, r.step_end + lookahead);
    return Status::Ok();
  }
  r.free_until = 0;  // this step may change any group
  // The common call - a running request's next step, well formed - is told apart with a few
  // comparisons; CheckAllocate's messages are built only when one of them fails.
  const bool well_formed = r.loads.empty() && !r.step_open && num_new >= 1 && lookahead >= 0 &&
                           (!r.started || (hit.tokens == 0 && !hit.encoder && hit.loads == 0));
  if (!well_formed) HKV_RETURN_IF_ERROR(CheckAllocate(r, num_new, hit, lookahead));
  if (!r.started) HKV_RETURN_IF_ERROR(CheckHit(r, hit, config, core.align, has_encoder));
  const int64_t begin = r.started ? r.computed : hit.tokens;
  // Compared by subtraction: begin + num_new + lookahead may not even be representable.
  if (num_new > config.max_model_len - begin ||
      lookahead > config.max_model_len - begin - num_new) {
    return Status::InvalidArgument(
        fmt::format("allocate: request {}: {} new tokens from position {} with lookahead {} exceed "
                    "max_model_len {}",
                    r.id, num_new, begin, lookahead, config.max_model_len));
  }
  StepPlan s;
  s.begin = begin;
  s.end = begin + num_new;
  s.lookahead = lookahead;
  s.reserve = std::max(r.reserved, s.end + lookahead);
  s.started = r.started;
  s.headroom = !r.started && config.admission_headroom_steps > 0 && started_requests > 0;
  s.hit = hit;
  // Plan: count what every pool must supply, and check that the hit still stands. Nothing
  // changes until every pool is known to suffice.
  const int64_t divergence = r.started ? r.divergence : DivergenceOf(r, hit.tokens);
  // Only state groups take snapshots; a model without them skips the planning on every step.
  if (has_state_groups) {
    core.PlanSnapshots(r, begin, s.end, divergence, positions);
  } else {
    positions.clear();
  }
  s.snapshots = positions;
  if (r.started && std::all_of(groups.begin(), groups.end(),
                               [&](const auto& g) { return g->StepIsFree(r, s); })) {
    r.copies.clear();
    for (manager_internal::GroupManager* g : free_step_workers)
      g->ApplyFreeStep(r);
    OpenStep(r, s);
    return Status::Ok();
  }
  // Where a first step's request keeps its window blocks (WindowBranchOf) reads which
  // full-attention blocks are cached. With fixed pools nothing is evicted before the apply, so it
  // is asked only once the step fits: a waiting request refused step after step skips it. With
  // two-level memory the fit may hand a slab with cached blocks to another class, so it is asked
  // first, as the cache stood.
  const bool branch_before_fit = !r.started && core.arena.num_slabs() > 0;
  const bool branch_after_fit = !r.started && !branch_before_fit;
  int64_t window_branch = branch_before_fit ? WindowBranchOf(r, hit.tokens) : r.window_branch;
  if (!r.started && ClearlyShort(r, s)) {
    ++core.stats.allocations_failed;
    return Shortfall(r, s, /*at_least=*/true);
  }
  HKV_RETURN_IF_ERROR(PlanAllocation(r, s));
  const Status fits = FitWithGiveBacks(r, s);
  if (!fits.ok()) {
    ++core.stats.allocations_failed;
    if (s.headroom) CountHeldForHeadroom(r, s);
    return fits;
  }
  if (branch_after_fit) window_branch = WindowBranchOf(r, hit.tokens);
  // Apply. Hit blocks are acquired before any fresh allocation so that eviction cannot take
  // them; copy sources and stale snapshots are released last for the same reason.
  if (!r.started) ApplyFirstStep(r, s);
  ApplyStep(r, s);
  if (!r.started) r.own_from = begin;
  // A started request keeps its own (a give-back above may have cleared it).
  if (!r.started) {
    // The thrash guard learns how long conversations take to come back; a hit reaching (within
    // one hit alignment) the end of the chain it continues keeps that chain's place.
    if (core.guard != nullptr) {
      const int64_t reach = hit.tokens > 0 ? (hit.tokens + core.align) / core.hash_tokens : 0;
      r.continued = core.guard->Started(r.hashes, reach, core.GuardNow());
      core.stats.thrash_returns_seen = core.guard->returns_seen();
    }
    r.window_branch = window_branch;
    // A remembered branch inside the hit (a system prompt before a previous turn's end): the
    // request holds its window blocks that are still cached, as it keeps its own at a branch.
    // Otherwise, while follow-up turns keep the prompt's full-attention blocks recent, nothing
    // refreshes its window, which ages out, and the next request sharing only the prompt misses.
    if (window_branch > 0 && window_branch < hit.tokens) {
      for (const auto& g : groups)
        g->HoldBranchWindow(r);
    }
  }
  r.divergence = divergence;
  OpenStep(r, s);
  return Status::Ok();
}

void KvCacheManager::Impl::OpenStep(Request& r, const StepPlan& s) {
  if (!r.started) ++started_requests;
  r.started = true;
  r.step_open = true;
  r.step_begin = s.begin;
  r.step_end = s.end;
  r.reserved = s.reserve;
  // A first step that loads external blocks runs only once they are in, in a later batch than
  // the requests that would hit it now.
  if (ahead_publishers.empty() || !r.loads.empty()) return;
  const int64_t limit = std::min({s.end, r.known(), r.publish_until});
  for (manager_internal::GroupManager* g : ahead_publishers)
    g->PublishAhead(r, limit);
}

Status KvCacheManager::Impl::CheckLent(const Request& r, int64_t limit, const char* call) const {
  for (const manager_internal::GroupManager* g : ahead_publishers) {
    int64_t block = 0;
    if (g->LentPast(r, limit, block)) {
      const int64_t upto = (block + 1) * g->config().block_tokens;
      return Status::FailedPrecondition(fmt::format(
          "{}: request {}: block {} of group {} (positions up to {}) was published when its open "
          "step [{}, {}) was allocated, and another request's hit holds it; that request reads "
          "it in the same batch, so the step must be committed at least to {} (or that request "
          "freed first)",
          call, r.id, block, g->group(), upto, r.step_begin, r.step_end, upto));
    }
  }
  return Status::Ok();
}

void KvCacheManager::Impl::AddAdmissionHeadroom() {
  // Every pool a decoder token group draws from must also keep what the started requests need
  // for the next admission_headroom_steps decode steps (one token each per step). It joins the
  // need, so the fit below - and the give-backs it may take - provide for it; the step then
  // allocates only its own blocks and leaves the headroom free.
  const int64_t tokens = int64_t{config.admission_headroom_steps} * started_requests;
  for (size_t p = 0; p < headroom.size(); ++p) {
    headroom[p] = 0;
    for (const int32_t bs : growing_block_tokens[p])
      headroom[p] += CeilDiv(tokens, static_cast<int64_t>(bs));
    core.need[p] += headroom[p];
  }
}

Status KvCacheManager::Impl::FitWithGiveBacks(Request& r, const StepPlan& s) {
  need_after_give_backs = false;
  bool fits = core.TryReserveBlocks();
  if (fits) return Status::Ok();
  // Windows kept at branch points and rolling recurrent states are cache, not need: short of
  // blocks, they are given back before anything is refused, and taken back when even that is not
  // enough. Giving back evicts nothing, so the hit still stands on every later plan.
  given_back.clear();
  given_back_branch.clear();
  // A waiting head may be refused every step. Everything given back at once, and one plan and
  // one check, decide whether the search below can succeed: a give-back only frees pages (the
  // request's own rolling state also lowers its need), so if the whole set does not fit, no
  // part of it does, and the search would end refused with every give-back applied - this plan's
  // need, this shortage. Only a step that will fit pays for the search.
  for (size_t from = 0; GiveBackBranchWindows(from);) {
  }
  for (size_t from = 0; has_state_groups && GiveBackRollingStates(r, from);) {
  }
  if (given_back.empty()) return Shortfall(r, s);
  Must(PlanAllocation(r, s));
  need_after_give_backs = true;
  const bool can_fit = core.CanReserveBlocks();
  UndoGiveBack();
  if (!can_fit) return Shortfall(r, s);
  for (size_t from = 0; !fits && GiveBackBranchWindows(from);) {
    Must(PlanAllocation(r, s));
    fits = core.TryReserveBlocks();
  }
  const size_t windows = given_back.size();
  for (size_t from = 0; !fits && has_state_groups && GiveBackRollingStates(r, from);) {
    Must(PlanAllocation(r, s));
    fits = core.TryReserveBlocks();
  }
  if (!fits) {
    // Not reached while give-backs only free pages (the check above said the whole set fits);
    // kept so that a give-back breaking that rule still refuses cleanly.
    UndoGiveBack();
    return Shortfall(r, s);
  }
  for (size_t i = 0; i < given_back.size(); ++i) {
    const manager_internal::GivenBack& g = given_back[i];
    group(static_cast<size_t>(g.group)).KeepGivenBack(requests[g.slot], g);
    // Under pressure the request keeps fewer rolling states from now on (manager_config.h).
    if (i >= windows) requests[g.slot].rolling_stride = core.config.rolling_stride_after_give_back;
  }
  core.stats.branch_blocks_given_back += static_cast<int64_t>(windows);
  core.stats.rolling_states_given_back += static_cast<int64_t>(given_back.size() - windows);
  return Status::Ok();
}

bool KvCacheManager::Impl::GiveBackRollingStates(Request& r, size_t& from_slot) {
  // The allocating request first: its own rolling state may be what makes its step need a block.
  for (; from_slot <= requests.size(); ++from_slot) {
    const bool own = from_slot == 0;
    Request& q = own ? r : requests[from_slot - 1];
    if (!own && (from_slot - 1 == static_cast<size_t>(r.slot) || !Live(from_slot - 1))) continue;
    const size_t before = given_back.size();
    for (const auto& g : groups)
      g->GiveBackRolling(q, own, given_back);
    if (given_back.size() > before) {
      ++from_slot;
      return true;
    }
  }
  return false;
}

bool KvCacheManager::Impl::GiveBackBranchWindows(size_t& from_slot) {
  for (; from_slot < requests.size(); ++from_slot) {
    const size_t slot = from_slot;
    Request& q = requests[slot];
    if (!GivesBackBranchWindows(slot)) continue;
    const size_t before = given_back.size();
    for (const auto& g : groups)
      g->GiveBackBranch(q, given_back);
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
  for (auto it = given_back.rbegin(); it != given_back.rend(); ++it)
    group(static_cast<size_t>(it->group)).RestoreGivenBack(*it);
  for (const auto& [slot, branch] : given_back_branch)
    requests[slot].window_branch = branch;
  given_back.clear();
  given_back_branch.clear();
}

bool KvCacheManager::Impl::ClearlyShort(const Request& r, const StepPlan& s) {
  if (core.arena.num_slabs() > 0 || s.hit.loads != 0 || s.hit.encoder ||
      r.lookup_tokens != s.hit.tokens || r.lookup_epochs != IdentityEpochs())
    return false;
  std::fill(core.need.begin(), core.need.end(), 0);
  for (const auto& g : groups) {
    const int64_t fresh = g->FreshNeed(r, s);
    if (fresh < 0) return false;
    core.need[static_cast<size_t>(g->pool())] += fresh;
  }
  if (core.FixedPoolsFit()) return false;
  // What FitWithGiveBacks could take back: windows kept at branch points (no kind that answers
  // FreshNeed keeps rolling states).
  for (size_t slot = 0; slot < requests.size(); ++slot)
    if (GivesBackBranchWindows(slot)) return false;
  return true;
}

void KvCacheManager::Impl::NoteFreeSteps(Request& r) {
  if (!free_steps) return;
  r.free_until = FreeStepsUntil(r);
  r.free_epoch = fast_epoch;
}

int64_t KvCacheManager::Impl::FreeStepsUntil(const Request& r) const {
  int64_t until = config.max_model_len;
  for (const auto& g : groups)
    until = std::min(until, g->FreeUntil(r));
  return until;
}

Status KvCacheManager::Impl::Commit(Request& r, int64_t c) {
  // The whole of a free step: the groups hold what they held, and nothing becomes publishable or
  // leaves a window (the step's Allocate opened it without them, free_until still stands).
  if (r.step_open && c == r.step_end && c <= r.free_until && HasFreeSteps(r) && r.loads.empty()) {
    r.computed = c;
    r.step_open = false;
    return Status::Ok();
  }
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
  for (const manager_internal::GroupManager* g : commit_checkers)
    HKV_RETURN_IF_ERROR(g->CheckCommit(r, c));
  const int64_t publish_limit = std::min({c, r.known(), r.publish_until});
  if (c < r.step_end && !ahead_publishers.empty())
    HKV_RETURN_IF_ERROR(CheckLent(r, publish_limit, "commit"));
  r.computed = c;
  r.step_open = false;
  r.copies.clear();
  for (const auto& g : groups)
    g->Commit(r, c, publish_limit);
  r.encoder_ready = r.encoder_ready || has_encoder;
  NoteFreeSteps(r);
  return Status::Ok();
}

}  // namespace hkv
