// Public entry points of KvCacheManager: request registration, lookups and the per-step views.
// The coordinator's operations live in allocate_commit.cc, truncate_fork_free.cc, hit_search.cc,
// evict.cc, compaction.cc and invariants.cc; each kind's rules in its group manager.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include <fmt/format.h>

#include <hkv/manager/kv_cache_manager.h>

#include "manager_impl.h"
#include "token_group.h"

namespace hkv {

double PoolUsage::usage() const {
  return num_blocks == 0 ? 0.0 : static_cast<double>(num_blocks - num_free) / num_blocks;
}

KvCacheManager::Impl::Impl(const ManagerConfig& c) : core(c), config(core.config) {
  using manager_internal::IsDecoderTokens;
  using manager_internal::ReleasesTokens;
  growing_block_tokens.resize(config.pool_blocks.size());
  headroom.resize(config.pool_blocks.size());
  for (size_t g = 0; g < config.groups.size(); ++g) {
    const GroupConfig& gc = config.groups[g];
    if (IsDecoderTokens(gc))
      growing_block_tokens[static_cast<size_t>(gc.pool)].push_back(gc.block_tokens);
    has_encoder = has_encoder || gc.is_encoder();
    has_state_groups = has_state_groups || gc.is_state();
    has_token_groups = has_token_groups || IsDecoderTokens(gc);
    if (IsDecoderTokens(gc)) ++slot_groups;
    has_window_groups = has_window_groups || ReleasesTokens(gc);
    groups.push_back(manager_internal::MakeGroupManager(core, static_cast<int32_t>(g)));
    if (groups.back()->KeepsPreviousStep()) previous_step_keepers.push_back(groups.back().get());
    if (groups.back()->RestrictsCommit()) commit_checkers.push_back(groups.back().get());
    if (groups.back()->WorksOnFreeStep()) free_step_workers.push_back(groups.back().get());
  }
  // One pool only. With two-level memory a window class's kept pages cannot serve a
  // full-attention allocation unless whole slabs empty, so keeping windows for remembered
  // branches turned refusals into preemptions there (docs/manager.md, "Windows at branch
  // points"); fixed classes cannot trade pages at all, and were not measured.
  if (has_window_groups && config.coherent_eviction && config.pool_blocks.size() == 1 &&
      !config.arena.enabled())
    branches = manager_internal::BranchMemory(config.branch_memory_entries);
  if (config.publish_at_allocate && config.enable_prefix_caching && !has_state_groups) {
    for (size_t g = 0; g < groups.size(); ++g)
      if (IsDecoderTokens(config.groups[g])) ahead_publishers.push_back(groups[g].get());
  }
  free_steps = !has_state_groups && !has_encoder;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    search_order.push_back(gi);
  std::stable_sort(search_order.begin(), search_order.end(), [&](size_t a, size_t b) {
    return groups[a]->SearchPass() < groups[b]->SearchPass();
  });
  token_search_groups =
      static_cast<size_t>(std::count_if(config.groups.begin(), config.groups.end(),
                                        [](const GroupConfig& gc) { return !gc.is_state(); }));
}

Result<KvCacheManager> KvCacheManager::Create(const ManagerConfig& config) {
  HKV_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config);
  manager_internal::CacheCore& core = impl->core;
  if (config.arena.enabled()) {
    HKV_ASSIGN_OR_RETURN(core.arena,
                         SlabArena::Create(config.arena.num_slabs, config.arena.pages_per_slab));
    std::vector<int32_t> state_pools;
    for (const GroupConfig& gc : config.groups)
      if (gc.is_state()) state_pools.push_back(gc.pool);
    HKV_RETURN_IF_ERROR(core.arena.SetStateClasses(state_pools));
    HKV_ASSIGN_OR_RETURN(core.pools, core.arena.MakePools(config.record_events));
  } else {
    for (int32_t blocks : config.pool_blocks) {
      HKV_ASSIGN_OR_RETURN(BlockPool pool, BlockPool::Create(blocks, config.record_events));
      core.pools.push_back(std::move(pool));
    }
  }
  for (BlockPool& bp : core.pools)
    HKV_RETURN_IF_ERROR(bp.set_eviction_rank(config.eviction_rank.get()));
  if (config.branch_bonus > 0 && config.eviction_rank == nullptr && config.enable_prefix_caching) {
    // Pools of an arena share one eviction clock, which frees in the finest class mostly advance:
    // a turnover is the arena counted in that class's pages. Fixed pools each have their own.
    int32_t largest = 0;
    for (const BlockPool& bp : core.pools)
      largest = std::max(largest, bp.num_blocks() - 1);
    for (BlockPool& bp : core.pools) {
      const double turnover = core.arena.num_slabs() > 0 ? largest : bp.num_blocks() - 1;
      const auto ticks = static_cast<uint64_t>(std::max(1.0, config.branch_bonus * turnover));
      HKV_RETURN_IF_ERROR(bp.set_branch_bonus(ticks, config.branch_bonus_levels));
    }
    core.share_branches = true;
  }
  if (config.thrash_guard && config.eviction_rank == nullptr && config.enable_prefix_caching) {
    // Fixed pools each keep their own clock: the guard reads the largest (the finest pages).
    for (size_t p = 0; p < core.pools.size(); ++p) {
      if (core.pools[p].num_blocks() >
          core.pools[static_cast<size_t>(core.guard_pool)].num_blocks())
        core.guard_pool = static_cast<int32_t>(p);
    }
    core.guard =
        std::make_unique<manager_internal::ThrashGuard>(config.thrash_keep_share, core.hash_tokens);
    core.stats.thrash_keep_share = core.guard->keep_share();
  }
  core.StartCoverage();
  return KvCacheManager(std::move(impl));
}

KvCacheManager::KvCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

// ---- lookups by id -------------------------------------------------------------------------

Status KvCacheManager::Impl::Unknown(const char* call, RequestId id) const {
  return Status::NotFound(fmt::format("{}: unknown request {}", call, id));
}

int32_t KvCacheManager::Impl::NewSlot() {
  if (!free_slots.empty()) {
    const int32_t slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }
  requests.emplace_back();
  requests.back().slot = static_cast<int32_t>(requests.size() - 1);
  for (auto& g : groups)
    g->AddSlot();
  return requests.back().slot;
}

// ---- public API: registration ---------------------------------------------------------------

Status KvCacheManager::AddRequest(const RequestSpec& spec) {
  Impl& m = *impl_;
  if (m.Find(spec.id) != nullptr) {
    return Status::InvalidArgument(
        fmt::format("add request {}: the id is already in use", spec.id));
  }
  const auto prompt_len = static_cast<int64_t>(spec.prompt.size());
  if (prompt_len == 0) {
    return Status::InvalidArgument(fmt::format("add request {}: empty prompt", spec.id));
  }
  if (prompt_len > m.config.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("add request {}: prompt of {} tokens exceeds max_model_len {}", spec.id,
                    prompt_len, m.config.max_model_len));
  }
  // A branch-free pass the compiler vectorizes (prompts run to thousands of tokens); the
  // offending position is searched for only when there is one.
  int32_t lowest = 0;
  for (const int32_t t : spec.prompt)
    lowest = std::min(lowest, t);
  if (lowest < 0) {
    const auto at = static_cast<size_t>(
        std::find_if(spec.prompt.begin(), spec.prompt.end(), [](int32_t t) { return t < 0; }) -
        spec.prompt.begin());
    return Status::InvalidArgument(fmt::format(
        "add request {}: token id {} at position {} is negative", spec.id, spec.prompt[at], at));
  }
  for (size_t i = 0; i < spec.items.size(); ++i) {
    const PromptItem& it = spec.items[i];
    if (it.length < 1) {
      return Status::InvalidArgument(fmt::format(
          "add request {}: item {} has length {}: expected >= 1", spec.id, i, it.length));
    }
    if (it.position < 0 || it.position + it.length > prompt_len) {
      return Status::InvalidArgument(fmt::format(
          "add request {}: item {} covers positions [{}, {}), outside the prompt of {} tokens",
          spec.id, i, it.position, it.position + it.length, prompt_len));
    }
  }
  if (m.has_encoder) {
    if (spec.encoder_tokens < 1 || spec.encoder_tokens > m.config.max_encoder_tokens) {
      return Status::InvalidArgument(
          fmt::format("add request {}: a cross-attention model needs 1..{} encoder tokens, got {}",
                      spec.id, m.config.max_encoder_tokens, spec.encoder_tokens));
    }
  } else if (spec.encoder_tokens != 0) {
    return Status::InvalidArgument(
        fmt::format("add request {}: {} encoder tokens, but the model has no cross-attention group",
                    spec.id, spec.encoder_tokens));
  }

  const int32_t slot = m.NewSlot();
  Request& r = m.requests[static_cast<size_t>(slot)];
  r.id = spec.id;
  r.tokens.assign(spec.prompt.begin(), spec.prompt.end());
  r.hashes.clear();
  r.adapter = spec.adapter_id;
  r.salt.assign(spec.cache_salt);
  r.items.assign(spec.items.begin(), spec.items.end());
  // A total order, so the digests do not depend on the order the caller listed items in.
  std::sort(r.items.begin(), r.items.end(), [](const PromptItem& a, const PromptItem& b) {
    return std::tie(a.position, a.length, a.content.hi, a.content.lo) <
           std::tie(b.position, b.length, b.content.hi, b.content.lo);
  });
  r.encoder_tokens = spec.encoder_tokens;
  r.encoder_input = spec.encoder_input;
  r.retention = spec.retention;
  r.prompt_len = prompt_len;
  r.divergence = 0;
  r.window_branch = 0;
  r.publish_until = Request::kNoLimit;
  r.computed = r.reserved = 0;
  r.started = r.step_open = r.encoder_ready = false;
  r.step_begin = r.step_end = 0;
  r.free_until = 0;
  r.lookup_tokens = -1;
  r.copies.clear();
  for (auto& g : m.groups)
    g->ClearSlot(slot);
  m.core.ExtendHashes(r);
  m.core.ComputeEncoderHashes(r);
  m.index.Insert(spec.id, slot);
  return Status::Ok();
}

Result<PrefixHit> KvCacheManager::Lookup(RequestId id) {
  return impl_->Lookup(id, nullptr);
}

Result<PrefixHit> KvCacheManager::Lookup(RequestId id, const ExternalBlocks& external) {
  return impl_->Lookup(id, &external);
}

Result<PrefixHit> KvCacheManager::Impl::Lookup(RequestId id, const ExternalBlocks* ext) {
  Request* r = Find(id);
  if (r == nullptr) return Unknown("lookup", id);
  if (r->started) {
    return Status::FailedPrecondition(fmt::format(
        "lookup: request {} has already allocated; a hit can only be taken before", id));
  }
  PrefixHit hit;
  ++core.stats.lookups;
  core.stats.lookup_tokens += r->known();
  if (config.enable_prefix_caching) {
    core.external = ext;
    core.external_keys.clear();
    core.external_answers.clear();
    if (ext != nullptr && ext->AnswersInBatches()) {
      // One question to the store for every key the hit rules may ask about.
      core.external_keys.clear();
      for (const auto& g : groups)
        g->ExternalCandidates(*r, r->known() - 1, core.external_keys);
      core.AskExternal();
    }
    int64_t x = LookupFixedPoint(*r, r->known() - 1);
    if (config.drop_last_hit_block && x > 0) x = LookupFixedPoint(*r, x - 1);
    core.external = nullptr;
    hit.tokens = x;
    if (ext != nullptr) {
      hit.loads = CountLoads(*r, x);
      if (hit.loads > 0) core.stats.external_hit_tokens += x;
    }
    if (has_encoder) {
      ++core.stats.encoder_lookups;
      hit.encoder = EncoderCached(*r);
      if (hit.encoder) ++core.stats.encoder_hits;
    }
  }
  core.stats.hit_tokens += hit.tokens;
  r->lookup_tokens = ext == nullptr ? hit.tokens : -1;
  r->lookup_epochs = IdentityEpochs();
  return hit;
}

Status KvCacheManager::Allocate(RequestId id, int64_t num_new_tokens, const PrefixHit& hit,
                                int64_t lookahead) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("allocate", id);
  const Status s = impl_->Allocate(*r, num_new_tokens, hit, lookahead);
  impl_->core.hit_keep.clear();  // CacheCore::PublishBlock reads it as this call's plan
  if (impl_->core.cover) impl_->core.SettleDrops();
  return s;
}

Status KvCacheManager::Commit(RequestId id, int64_t computed) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("commit", id);
  return impl_->Commit(*r, computed);
}

Status KvCacheManager::AppendTokens(RequestId id, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  Request* r = m.Find(id);
  if (r == nullptr) return m.Unknown("append tokens", id);
  const int64_t total = r->known() + static_cast<int64_t>(tokens.size());
  if (total > m.config.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("append tokens: request {} would reach {} tokens, beyond max_model_len {}", id,
                    total, m.config.max_model_len));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return Status::InvalidArgument(fmt::format(
          "append tokens: request {}: token id {} (index {}) is negative", id, tokens[i], i));
    }
  }
  r->tokens.insert(r->tokens.end(), tokens.begin(), tokens.end());
  m.core.ExtendHashes(*r);
  return Status::Ok();
}

Status KvCacheManager::Fork(RequestId parent, RequestId child) {
  const Request* p = impl_->Find(parent);
  if (p == nullptr) return impl_->Unknown("fork", parent);
  impl_->ForgetFreeSteps();  // the parent's blocks become shared
  return impl_->Fork(*p, child);
}

Result<TruncateResult> KvCacheManager::Truncate(RequestId id, int64_t n) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("truncate", id);
  impl_->ForgetFreeSteps();
  return impl_->Truncate(*r, n);
}

Status KvCacheManager::Free(RequestId id, FreeReason reason) {
  Impl& m = *impl_;
  Request* r = m.Find(id);
  if (r == nullptr) {
    return Status::NotFound(
        fmt::format("free: unknown request {} (never added, or already freed)", id));
  }
  if (r->step_open) HKV_RETURN_IF_ERROR(m.CheckLent(*r, r->computed, "free"));
  if (m.config.record_events) m.freed_tokens.emplace_back(id, r->tokens);
  m.FreeRequest(*r, reason);
  const int32_t slot = m.index.Find(id);
  m.index.Erase(id);
  m.free_slots.push_back(slot);
  return Status::Ok();
}

Status KvCacheManager::FinishLoad(RequestId id, bool loaded) {
  Impl& m = *impl_;
  Request* r = m.Find(id);
  if (r == nullptr) return m.Unknown("finish load", id);
  if (r->loads.empty()) {
    return Status::FailedPrecondition(fmt::format(
        "finish load: request {} has no loads pending (only the first Allocate of a hit with "
        "external blocks has)",
        id));
  }
  m.ForgetFreeSteps();
  if (!loaded) {
    ++m.core.stats.loads_failed;
    m.AbandonStart(*r);
    return Status::Ok();
  }
  for (const BlockLoad& l : r->loads)
    m.core.PublishBlock(l.pool, l.block, l.key, *r, l.position);
  m.core.stats.blocks_loaded += static_cast<int64_t>(r->loads.size());
  r->loads.clear();
  return Status::Ok();
}

Status KvCacheManager::ResetPrefixCache() {
  Impl& m = *impl_;
  for (size_t p = 0; p < m.core.pools.size(); ++p) {
    const BlockPool& bp = m.core.pools[p];
    if (bp.num_free() != bp.num_owned()) {
      return Status::FailedPrecondition(
          fmt::format("reset prefix cache: pool {} has {} blocks in use; free every request first",
                      p, bp.num_owned() - bp.num_free()));
    }
  }
  for (BlockPool& bp : m.core.pools) {
    bp.ResetPrefixCache();
    bp.TakeDropped(m.core.dropped);  // nothing of it is cached any more
  }
  m.core.coverage.Clear();
  m.branches.Clear();  // a reset manager behaves as a new one
  m.ForgetFreeSteps();
  return Status::Ok();
}

Status KvCacheManager::Rerank(std::span<const BlockHash> digests) {
  Impl& m = *impl_;
  if (m.core.config.eviction_rank == nullptr) {
    return Status::FailedPrecondition("rerank: the manager has no eviction rank (ManagerConfig)");
  }
  m.ForgetFreeSteps();
  const std::vector<GroupConfig>& groups = m.core.config.groups;
  for (const BlockHash& d : digests) {
    for (size_t g = 0; g < groups.size(); ++g) {
      BlockPool& bp = m.core.pools[static_cast<size_t>(groups[g].pool)];
      const int32_t b = bp.Find({d, static_cast<int32_t>(g)});
      if (b >= 0) manager_internal::Must(bp.Rerank(b));
    }
  }
  return Status::Ok();
}

// ---- per-step views -------------------------------------------------------------------------

Result<StepInfo> KvCacheManager::Step(RequestId id) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("step", id);
  if (!r->step_open) {
    return Status::FailedPrecondition(
        fmt::format("step: request {} has no open step (call Allocate first)", id));
  }
  return impl_->StepOf(*r);
}

namespace {

Status CheckGroup(const ManagerConfig& c, const char* call, int32_t group) {
  if (group < 0 || static_cast<size_t>(group) >= c.groups.size()) {
    return Status::InvalidArgument(
        fmt::format("{}: group {} out of range (the model has {})", call, group, c.groups.size()));
  }
  return Status::Ok();
}

}  // namespace

Result<std::span<const int32_t>> KvCacheManager::BlockTable(RequestId id, int32_t group) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("block table", id);
  HKV_RETURN_IF_ERROR(CheckGroup(impl_->config, "block table", group));
  if (impl_->config.groups[static_cast<size_t>(group)].is_state()) {
    return Status::InvalidArgument(
        fmt::format("block table: group {} is a state group; use State()", group));
  }
  return impl_->group(static_cast<size_t>(group)).Table(r->slot);
}

Status KvCacheManager::SlotMapping(RequestId id, int32_t group, int64_t begin, int64_t end,
                                   std::span<int64_t> out) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("slot mapping", id);
  return impl_->MapSlots(*r, group, begin, end, out);
}

Status KvCacheManager::Impl::MapSlots(const Request& req, int32_t group, int64_t begin, int64_t end,
                                      std::span<int64_t> out) const {
  const Request* r = &req;
  const RequestId id = r->id;
  HKV_RETURN_IF_ERROR(CheckGroup(config, "slot mapping", group));
  const GroupConfig& gc = config.groups[static_cast<size_t>(group)];
  if (gc.is_state()) {
    return Status::InvalidArgument(
        fmt::format("slot mapping: group {} is a state group; use State()", group));
  }
  const manager_internal::GroupManager& gm = this->group(static_cast<size_t>(group));
  int64_t shift = 0;  // after Evict, position p sits in slot p - evicted
  const std::span<const int32_t> table = gm.TableAndEvicted(r->slot, shift);
  const int64_t bs = gc.block_tokens;
  const int64_t limit = gc.is_encoder() ? static_cast<int64_t>(table.size()) * bs : r->reserved;
  if (shift > 0 && begin < r->computed && begin < end) {
    return Status::InvalidArgument(fmt::format(
        "slot mapping: request {} group {} evicted tokens; positions before its computed {} have "
        "no fixed slot (asked from {})",
        id, group, r->computed, begin));
  }
  if (begin > end) {
    return Status::InvalidArgument(
        fmt::format("slot mapping: positions [{}, {}) of request {} group {}: end before begin",
                    begin, end, id, group));
  }
  if (begin < 0 || end > limit) {
    return Status::InvalidArgument(fmt::format(
        "slot mapping: positions [{}, {}) outside the reserved [0, {}) of request {} group {}",
        begin, end, limit, id, group));
  }
  for (int64_t p = begin - shift; p < end - shift; p += bs - p % bs) {
    if (table[static_cast<size_t>(p / bs)] == BlockPool::kNullBlock) {
      return Status::InvalidArgument(fmt::format(
          "slot mapping: position {} of request {} group {} is no longer kept (window or chunk)",
          p + shift, id, group));
    }
  }
  if (static_cast<int64_t>(out.size()) != end - begin) {
    return Status::InvalidArgument(
        fmt::format("slot mapping: an output of {} slots for the {} positions [{}, {})", out.size(),
                    end - begin, begin, end));
  }
  manager_internal::FillSlots(table, manager_internal::BlockMath(bs), begin - shift, end - shift,
                              out);
  return Status::Ok();
}

Status KvCacheManager::SlotMapping(RequestId id, int32_t group, int64_t begin, int64_t end,
                                   std::vector<int64_t>& out) const {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  Status st = SlotMapping(id, group, begin, end, std::span<int64_t>(out).subspan(at));
  if (!st.ok()) out.resize(at);
  return st;
}

Result<TableDelta> KvCacheManager::TakeTableDelta(RequestId id, int32_t group) {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("table delta", id);
  HKV_RETURN_IF_ERROR(CheckGroup(impl_->config, "table delta", group));
  TableDelta out;
  if (!impl_->group(static_cast<size_t>(group)).TakeDelta(r->slot, out)) {
    return Status::InvalidArgument(
        fmt::format("table delta: group {} is a state group; use State()", group));
  }
  return out;
}

Status KvCacheManager::TakeStepInputs(RequestId id, StepInputs& out) {
  Impl& m = *impl_;
  const Request* r = m.Find(id);
  if (r == nullptr) return m.Unknown("step inputs", id);
  if (!r->step_open) {
    return Status::FailedPrecondition(
        fmt::format("step inputs: request {} has no open step (call Allocate first)", id));
  }
  out.step = m.StepOf(*r);
  const size_t n = m.groups.size();
  out.tables.resize(n);
  out.states.resize(n);
  out.slots.resize(static_cast<size_t>(r->step_end - r->step_begin) * m.slot_groups);
  size_t at = 0;
  for (size_t g = 0; g < n; ++g)
    m.groups[g]->TakeInputs(*r, g, out, at);
  return Status::Ok();
}

Result<StateStep> KvCacheManager::State(RequestId id, int32_t group) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("state", id);
  HKV_RETURN_IF_ERROR(CheckGroup(impl_->config, "state", group));
  if (!impl_->config.groups[static_cast<size_t>(group)].is_state()) {
    return Status::InvalidArgument(fmt::format("state: group {} is not a state group", group));
  }
  if (!r->step_open) {
    return Status::FailedPrecondition(
        fmt::format("state: request {} has no open step (call Allocate first)", id));
  }
  return impl_->group(static_cast<size_t>(group)).StepState(r->slot);
}

// ---- facts ----------------------------------------------------------------------------------

bool KvCacheManager::Contains(RequestId id) const {
  return impl_->Find(id) != nullptr;
}

Result<int64_t> KvCacheManager::NumTokens(RequestId id) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("num tokens", id);
  return r->known();
}

Result<std::span<const int32_t>> KvCacheManager::Tokens(RequestId id) const {
  const Impl& m = *impl_;
  if (const Request* r = m.Find(id)) return std::span<const int32_t>(r->tokens);
  for (const auto* list : {&m.freed_tokens, &m.taken_freed_tokens}) {
    for (auto it = list->rbegin(); it != list->rend(); ++it) {
      if (it->first == id) return std::span<const int32_t>(it->second);
    }
  }
  return m.Unknown("tokens", id);
}

Result<int64_t> KvCacheManager::NumComputed(RequestId id) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("num computed", id);
  return r->computed;
}

int32_t KvCacheManager::num_requests() const {
  return impl_->index.size();
}
const ManagerConfig& KvCacheManager::config() const {
  return impl_->config;
}
const ManagerStats& KvCacheManager::stats() const {
  return impl_->core.stats;
}

PoolUsage KvCacheManager::Usage(int32_t pool) const {
  if (pool < 0 || static_cast<size_t>(pool) >= impl_->core.pools.size()) return {};
  const BlockPool& bp = impl_->core.pools[static_cast<size_t>(pool)];
  if (impl_->core.arena.num_slabs() == 0) {
    return {bp.num_owned(), bp.num_free(), bp.num_cached(), 0, 0, bp.num_free_cached()};
  }
  return {bp.num_owned(),      bp.num_free(),       bp.num_cached(), bp.free_in_held_segments(),
          bp.StrandedBlocks(), bp.num_free_cached()};
}

std::vector<ManagerEvent> KvCacheManager::TakeEvents() {
  impl_->taken_freed_tokens = std::move(impl_->freed_tokens);
  impl_->freed_tokens.clear();
  std::vector<ManagerEvent> out;
  for (size_t p = 0; p < impl_->core.pools.size(); ++p) {
    for (const KvEvent& e : impl_->core.pools[p].TakeEvents()) {
      out.push_back({e.kind, static_cast<int32_t>(p), e.key.group, e.key.hash, e.block,
                     e.from.origin, e.from.position, e.from.parent, e.from.adapter});
    }
  }
  return out;
}

ArenaUsage KvCacheManager::Arena() const {
  if (impl_->core.arena.num_slabs() == 0) return {};
  return impl_->core.arena.Usage(impl_->core.pools);
}

Status KvCacheManager::CheckInvariants() const {
  return impl_->CheckInvariants();
}

}  // namespace hkv
