// Public entry points of KvCacheManager, request registration, identities and per-step views.
// The mutating operations live in allocate_commit.cc, truncate_fork_free.cc and hit_search.cc.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include <fmt/format.h>

#include <hkv/manager/kv_cache_manager.h>

#include "manager_impl.h"

namespace hkv {

void manager_internal::Must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "hkv::KvCacheManager internal error: %s\n", s.ToString().c_str());
    std::abort();
  }
}

void GroupState::Clear() {
  table.clear();
  num_published = 0;
  release_from = 0;
  evicted = 0;
  live = 0;
  rolling = {};
  held.clear();
  read = write = 0;
  snaps.clear();
}

double PoolUsage::usage() const {
  return num_blocks == 0 ? 0.0 : static_cast<double>(num_blocks - num_free) / num_blocks;
}

KvCacheManager::Impl::Impl(const ManagerConfig& c)
    : config(c), hash_tokens(c.hash_tokens()), align(c.align_tokens()) {
  for (const GroupConfig& g : config.groups)
    has_encoder = has_encoder || g.is_encoder();
  need.resize(config.pool_blocks.size());
  full_prefix.resize(config.groups.size());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t gi = 0; gi < config.groups.size(); ++gi) {
      if (config.groups[gi].is_state() == (pass == 1)) search_order.push_back(gi);
    }
  }
}

Result<KvCacheManager> KvCacheManager::Create(const ManagerConfig& config) {
  HKV_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config);
  if (config.arena.enabled()) {
    HKV_ASSIGN_OR_RETURN(impl->arena,
                         SlabArena::Create(config.arena.num_slabs, config.arena.pages_per_slab));
    HKV_ASSIGN_OR_RETURN(impl->pools, impl->arena.MakePools(config.record_events));
    return KvCacheManager(std::move(impl));
  }
  for (int32_t blocks : config.pool_blocks) {
    HKV_ASSIGN_OR_RETURN(BlockPool pool, BlockPool::Create(blocks, config.record_events));
    impl->pools.push_back(std::move(pool));
  }
  return KvCacheManager(std::move(impl));
}

KvCacheManager::KvCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

// ---- lookups by id -------------------------------------------------------------------------

Request* KvCacheManager::Impl::Find(RequestId id) {
  const int32_t slot = index.Find(id);
  return slot < 0 ? nullptr : &requests[static_cast<size_t>(slot)];
}

const Request* KvCacheManager::Impl::Find(RequestId id) const {
  const int32_t slot = index.Find(id);
  return slot < 0 ? nullptr : &requests[static_cast<size_t>(slot)];
}

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
  requests.back().groups.resize(config.groups.size());
  return static_cast<int32_t>(requests.size() - 1);
}

// ---- identities -----------------------------------------------------------------------------

void KvCacheManager::Impl::ExtendHashes(Request& r) {
  const int64_t g = hash_tokens;
  const int64_t full = r.known() / g;
  while (static_cast<int64_t>(r.hashes.size()) < full) {
    const int64_t i = static_cast<int64_t>(r.hashes.size());
    const int64_t start = i * g;
    scratch_items.clear();
    for (const PromptItem& item : r.items) {
      if (item.position >= start + g) break;
      if (item.position + item.length > start) {
        scratch_items.push_back({item.content, item.position - start});
      }
    }
    // A cross-attention decoder's KV depends on the encoder's input too: the first block
    // carries it, as an item at an offset no real item can have there (items start at >= 0).
    if (i == 0 && r.encoder_tokens > 0) {
      scratch_items.insert(scratch_items.begin(), {r.encoder_input, -1 - r.encoder_tokens});
    }
    const BlockHash& parent = i == 0 ? kRootHash : r.hashes.back();
    BlockExtraKeys extra{r.adapter, scratch_items, i == 0 ? std::string_view(r.salt) : ""};
    r.hashes.push_back(HashBlock(
        parent, std::span<const int32_t>(r.tokens.data() + start, static_cast<size_t>(g)), extra));
  }
}

void KvCacheManager::Impl::ComputeEncoderHashes(Request& r) {
  r.encoder_hashes.clear();
  int64_t blocks = 0;
  for (const GroupConfig& gc : config.groups) {
    if (gc.is_encoder()) blocks = std::max(blocks, CeilDiv(r.encoder_tokens, gc.block_tokens));
  }
  if (blocks == 0) return;
  // The root covers everything that decides the encoder's output: its input, its length, the
  // adapter and the salt. Blocks chain from it by index; keys are namespaced per group, so
  // groups with different block sizes never confuse their blocks.
  const MultimodalItem input{r.encoder_input, 0};
  const int32_t length[2] = {static_cast<int32_t>(r.encoder_tokens >> 31),
                             static_cast<int32_t>(r.encoder_tokens & 0x7fffffff)};
  const BlockHash root = HashBlock(kRootHash, length, {r.adapter, {&input, 1}, r.salt});
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t block_index = static_cast<int32_t>(i);
    r.encoder_hashes.push_back(HashBlock(root, {&block_index, 1}));
  }
}

const BlockHash& KvCacheManager::Impl::HashAt(const Request& r, int64_t position) const {
  return r.hashes[static_cast<size_t>(position / hash_tokens - 1)];
}

PrefixKey KvCacheManager::Impl::TokenKey(const Request& r, int32_t group, int64_t block) const {
  const int64_t bs = config.groups[static_cast<size_t>(group)].block_tokens;
  return {HashAt(r, (block + 1) * bs), group};
}

PrefixKey KvCacheManager::Impl::StateKey(const Request& r, int32_t group, int64_t position) const {
  return {HashAt(r, position), group};
}

bool KvCacheManager::Impl::IsCheckpoint(const Request& r, int64_t p) const {
  if (p <= 0 || p % align != 0) return false;
  if (config.checkpoint_interval > 0 && p % config.checkpoint_interval == 0) return true;
  if (p == r.divergence) return true;
  return p == PromptCheckpoint(r);
}

bool KvCacheManager::Impl::IsIntervalOnly(const Request& r, int64_t p) const {
  return p > 0 && config.checkpoint_interval > 0 && p % config.checkpoint_interval == 0 &&
         p != r.divergence && p != PromptCheckpoint(r);
}

void KvCacheManager::Impl::DemoteCheckpoint(const Request& r, int32_t group, int64_t p) {
  BlockPool& bp = pools[static_cast<size_t>(config.groups[static_cast<size_t>(group)].pool)];
  const int32_t b = bp.Find(StateKey(r, group, p));
  // Held means some request is about to read it (or holds it as its own state): leave it.
  if (b > BlockPool::kNullBlock && bp.ref_count(b) == 0) Must(bp.Demote(b));
}

void KvCacheManager::Impl::DemoteBeyondCap(const Request& r, int32_t group, int64_t begin,
                                           int64_t end) {
  const int64_t interval = config.checkpoint_interval;
  const int64_t cap = config.max_interval_checkpoints;
  if (!config.demote_superseded_checkpoints || !config.enable_prefix_caching || interval == 0 ||
      cap == 0) {
    return;
  }
  for (int64_t p = (begin / interval + 1) * interval; p <= end; p += interval) {
    const int64_t old = p - cap * interval;
    if (old > r.own_from && IsIntervalOnly(r, old)) {
      DemoteCheckpoint(r, group, old);
    }
  }
}

void KvCacheManager::Impl::DemoteSupersededCheckpoints(const Request& r, int32_t group,
                                                       int64_t live_position,
                                                       int64_t rolling_position) {
  if (!config.demote_superseded_checkpoints || !config.enable_prefix_caching) return;
  // The request's final state: the newest of the live one (published at an aligned end), the
  // rolling one, and the checkpoints its steps passed.
  const int64_t reached = std::min(r.computed, r.known());
  const int64_t interval = config.checkpoint_interval;
  const int64_t prompt_ckpt = PromptCheckpoint(r);
  int64_t final_position = std::max(live_position, rolling_position);
  if (interval > 0) final_position = std::max(final_position, reached / interval * interval);
  if (prompt_ckpt <= reached) final_position = std::max(final_position, prompt_ckpt);
  if (r.divergence <= reached) final_position = std::max(final_position, r.divergence);
  const auto demote = [&](int64_t p) {
    if (p > r.own_from && p < final_position && p != r.divergence) DemoteCheckpoint(r, group, p);
  };
  demote(prompt_ckpt);
  demote(rolling_position);
  if (interval == 0) return;
  // Older interval checkpoints were demoted by the cap while the request ran.
  int64_t lo = r.own_from;
  if (config.max_interval_checkpoints > 0) {
    lo = std::max(lo, final_position - (config.max_interval_checkpoints + 1) * interval);
  }
  for (int64_t p = (lo / interval + 1) * interval; p < final_position; p += interval)
    demote(p);
}

NeededBlocks KvCacheManager::Impl::Needed(int32_t group, int64_t x) const {
  const GroupConfig& gc = config.groups[static_cast<size_t>(group)];
  NeededBlocks n;
  if (x <= 0) return n;
  const int64_t bs = gc.block_tokens;
  n.hi = CeilDiv(x, bs);
  switch (gc.rule.kind) {
    case TokenRuleKind::kWindow:
      n.lo = std::max<int64_t>(0, x - gc.rule.span + 1) / bs;
      n.sinks = std::min(CeilDiv(std::min<int64_t>(gc.rule.sinks, x), bs), n.lo);
      break;
    case TokenRuleKind::kChunk:
      n.lo = x / gc.rule.span * gc.rule.span / bs;
      break;
    default:
      break;
  }
  return n;
}

// ---- block movement -------------------------------------------------------------------------

void KvCacheManager::Impl::Release(int32_t pool, std::span<const int32_t> blocks,
                                   Retention retention) {
  if (blocks.empty()) return;
  BlockPool& bp = pools[static_cast<size_t>(pool)];
  release_low.clear();
  release_normal.clear();
  for (int32_t b : blocks) {
    // A reference that is not the last one only drops the count (the list may name a block
    // twice, e.g. a state that is both live and rolling); the last reference decides where the
    // block goes.
    if (bp.ref_count(b) > 1) {
      Must(bp.Free({&b, 1}));
    } else if (!bp.has_identity(b)) {
      release_low.push_back(b);
    } else {
      release_normal.push_back(b);
    }
  }
  Must(bp.Free(release_low, Retention::kLow));
  Must(bp.Free(release_normal, retention));
}

void KvCacheManager::Impl::ReleaseOne(int32_t pool, int32_t block, Retention retention) {
  if (block == BlockPool::kNullBlock) return;
  Release(pool, {&block, 1}, retention);
}

void KvCacheManager::Impl::AcquireHeld(int32_t pool, int32_t block) {
  Must(pools[static_cast<size_t>(pool)].Acquire(block));
}

void KvCacheManager::Impl::PublishBlock(int32_t pool, int32_t block, const PrefixKey& key,
                                        RequestId origin, int64_t position) {
  if (!config.enable_prefix_caching) return;
  BlockPool& bp = pools[static_cast<size_t>(pool)];
  if (bp.has_identity(block)) return;
  Must(bp.Publish(block, key, origin, position));
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
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    if (spec.prompt[i] < 0) {
      return Status::InvalidArgument(fmt::format(
          "add request {}: token id {} at position {} is negative", spec.id, spec.prompt[i], i));
    }
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
  r.copies.clear();
  for (GroupState& gs : r.groups)
    gs.Clear();
  m.ExtendHashes(r);
  m.ComputeEncoderHashes(r);
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
  const Request* r = Find(id);
  if (r == nullptr) return Unknown("lookup", id);
  if (r->started) {
    return Status::FailedPrecondition(fmt::format(
        "lookup: request {} has already allocated; a hit can only be taken before", id));
  }
  PrefixHit hit;
  ++stats.lookups;
  stats.lookup_tokens += r->known();
  if (config.enable_prefix_caching) {
    external = ext;
    int64_t x = LookupFixedPoint(*r, r->known() - 1);
    if (config.drop_last_hit_block && x > 0) x = LookupFixedPoint(*r, x - 1);
    external = nullptr;
    hit.tokens = x;
    if (ext != nullptr) {
      hit.loads = CountLoads(*r, x);
      if (hit.loads > 0) stats.external_hit_tokens += x;
    }
    if (has_encoder) {
      ++stats.encoder_lookups;
      hit.encoder = EncoderCached(*r);
      if (hit.encoder) ++stats.encoder_hits;
    }
  }
  stats.hit_tokens += hit.tokens;
  return hit;
}

Status KvCacheManager::Allocate(RequestId id, int64_t num_new_tokens, const PrefixHit& hit,
                                int64_t lookahead) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("allocate", id);
  return impl_->Allocate(*r, num_new_tokens, hit, lookahead);
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
  m.ExtendHashes(*r);
  return Status::Ok();
}

Status KvCacheManager::Fork(RequestId parent, RequestId child) {
  const Request* p = impl_->Find(parent);
  if (p == nullptr) return impl_->Unknown("fork", parent);
  return impl_->Fork(*p, child);
}

Result<TruncateResult> KvCacheManager::Truncate(RequestId id, int64_t n) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("truncate", id);
  return impl_->Truncate(*r, n);
}

Status KvCacheManager::Free(RequestId id) {
  Impl& m = *impl_;
  Request* r = m.Find(id);
  if (r == nullptr) {
    return Status::NotFound(
        fmt::format("free: unknown request {} (never added, or already freed)", id));
  }
  m.FreeRequest(*r);
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
  if (!loaded) {
    ++m.stats.loads_failed;
    m.AbandonStart(*r);
    return Status::Ok();
  }
  for (const BlockLoad& l : r->loads)
    m.PublishBlock(l.pool, l.block, l.key, id, l.position);
  m.stats.blocks_loaded += static_cast<int64_t>(r->loads.size());
  r->loads.clear();
  return Status::Ok();
}

Status KvCacheManager::ResetPrefixCache() {
  Impl& m = *impl_;
  for (size_t p = 0; p < m.pools.size(); ++p) {
    const BlockPool& bp = m.pools[p];
    if (bp.num_free() != bp.num_owned()) {
      return Status::FailedPrecondition(
          fmt::format("reset prefix cache: pool {} has {} blocks in use; free every request first",
                      p, bp.num_owned() - bp.num_free()));
    }
  }
  for (BlockPool& bp : m.pools)
    bp.ResetPrefixCache();
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
  StepInfo s;
  s.begin = r->step_begin;
  s.end = r->step_end;
  s.reserved_end = r->reserved;
  s.run_encoder = impl_->has_encoder && !r->encoder_ready;
  s.copies = r->copies;
  s.loads = r->loads;
  return s;
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
  return std::span<const int32_t>(r->groups[static_cast<size_t>(group)].table);
}

Status KvCacheManager::SlotMapping(RequestId id, int32_t group, int64_t begin, int64_t end,
                                   std::span<int64_t> out) const {
  const Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("slot mapping", id);
  HKV_RETURN_IF_ERROR(CheckGroup(impl_->config, "slot mapping", group));
  const GroupConfig& gc = impl_->config.groups[static_cast<size_t>(group)];
  if (gc.is_state()) {
    return Status::InvalidArgument(
        fmt::format("slot mapping: group {} is a state group; use State()", group));
  }
  const GroupState& gs = r->groups[static_cast<size_t>(group)];
  const std::vector<int32_t>& table = gs.table;
  const int64_t bs = gc.block_tokens;
  const int64_t limit = gc.is_encoder() ? static_cast<int64_t>(table.size()) * bs : r->reserved;
  if (gs.evicted > 0 && begin < r->computed && begin < end) {
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
  // After Evict, position p sits in slot p - evicted.
  const int64_t shift = gs.evicted;
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
  // One block at a time: slots within a block are consecutive.
  size_t at = 0;
  for (int64_t p = begin - shift; p < end - shift;) {
    const int64_t block_end = std::min(end - shift, (p / bs + 1) * bs);
    int64_t slot = int64_t{table[static_cast<size_t>(p / bs)]} * bs + p % bs;
    for (; p < block_end; ++p)
      out[at++] = slot++;
  }
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
  const GroupState& gs = r->groups[static_cast<size_t>(group)];
  return StateStep{gs.read, gs.write, gs.snaps};
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
  return impl_->stats;
}

PoolUsage KvCacheManager::Usage(int32_t pool) const {
  if (pool < 0 || static_cast<size_t>(pool) >= impl_->pools.size()) return {};
  const BlockPool& bp = impl_->pools[static_cast<size_t>(pool)];
  if (impl_->arena.num_slabs() == 0) return {bp.num_owned(), bp.num_free(), bp.num_cached()};
  return {bp.num_owned(), bp.num_free(), bp.num_cached(), bp.free_in_held_segments(),
          bp.StrandedBlocks()};
}

std::vector<ManagerEvent> KvCacheManager::TakeEvents() {
  std::vector<ManagerEvent> out;
  for (size_t p = 0; p < impl_->pools.size(); ++p) {
    for (const KvEvent& e : impl_->pools[p].TakeEvents()) {
      out.push_back({e.kind, static_cast<int32_t>(p), e.key.group, e.key.hash, e.block, e.origin,
                     e.position});
    }
  }
  return out;
}

ArenaUsage KvCacheManager::Arena() const {
  if (impl_->arena.num_slabs() == 0) return {};
  return impl_->arena.Usage(impl_->pools);
}

Status KvCacheManager::CheckInvariants() const {
  return impl_->CheckInvariants();
}

}  // namespace hkv
