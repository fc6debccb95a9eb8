// The coordinator (vLLM's Unitary/HybridKVCacheCoordinator) and KVCacheManager on top of it.
#include <algorithm>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include <hkv/vllm/kv_cache_manager.h>

#include "block_pool.h"
#include "single_type_manager.h"

namespace hkv::vllm {

Request::Request(RequestId id, std::span<const int32_t> prompt, int32_t hash_block_size)
    : id_(id),
      num_prompt_tokens_(static_cast<int64_t>(prompt.size())),
      hash_block_size_(hash_block_size),
      num_tokens_(static_cast<int64_t>(prompt.size())),
      tokens_(prompt.begin(), prompt.end()) {
  if (hash_block_size < 1) return;
  const size_t bs = static_cast<size_t>(hash_block_size);
  BlockHash parent = kRootHash;
  for (size_t b = 0; (b + 1) * bs <= tokens_.size(); ++b) {
    parent = HashBlock(parent, std::span<const int32_t>(tokens_).subspan(b * bs, bs));
    hashes_.push_back(parent);
  }
}

Request Request::Hashed(RequestId id, int64_t num_prompt_tokens, int32_t hash_block_size) {
  Request r(id, {}, hash_block_size);
  r.num_prompt_tokens_ = r.num_tokens_ = num_prompt_tokens;
  return r;
}

void Request::Extend(int64_t num_tokens, std::span<const BlockHash> hashes) {
  num_tokens_ = num_tokens;
  hashes_.insert(hashes_.end(), hashes.begin(), hashes.end());
}

void Request::AppendToken(int32_t token) {
  tokens_.push_back(token);
  ++num_tokens_;
  if (hash_block_size_ < 1) return;
  const size_t bs = static_cast<size_t>(hash_block_size_);
  if (tokens_.size() % bs != 0) return;
  const BlockHash parent = hashes_.empty() ? kRootHash : hashes_.back();
  hashes_.push_back(HashBlock(parent, std::span<const int32_t>(tokens_).last(bs)));
}

bool GroupBlocks::empty() const {
  return std::all_of(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); });
}

struct KvCacheManager::Impl {
  struct AttentionGroup {
    SingleTypeManager* manager;  // the first group's (the rule is per spec)
    std::vector<int32_t> group_ids;
  };

  KvCacheConfig config;
  ManagerOptions options;
  std::vector<CacheEvent> events;
  BlockPool pool;
  std::vector<std::unique_ptr<SingleTypeManager>> managers;
  bool hybrid = false;
  std::vector<AttentionGroup> attention_groups;  // full attention first
  int32_t lcm_block_size = 0;

  Impl(const KvCacheConfig& c, const ManagerOptions& o)
      : config(c), options(o), pool(c.num_blocks) {
    if (o.record_events) pool.set_events(&events);
    for (size_t g = 0; g < c.groups.size(); ++g) {
      managers.push_back(
          MakeSingleTypeManager(c.groups[g].spec, &pool, static_cast<int32_t>(g), c));
    }
    hybrid = c.groups.size() > 1;
    lcm_block_size = 1;
    for (size_t g = 0; g < c.groups.size(); ++g) {
      lcm_block_size = std::lcm(lcm_block_size, c.groups[g].spec.block_size);
      auto it = std::find_if(
          attention_groups.begin(), attention_groups.end(),
          [&](const AttentionGroup& a) { return a.manager->spec() == c.groups[g].spec; });
      if (it == attention_groups.end()) {
        attention_groups.push_back({managers[g].get(), {}});
        it = attention_groups.end() - 1;
      }
      it->group_ids.push_back(static_cast<int32_t>(g));
    }
    std::stable_sort(attention_groups.begin(), attention_groups.end(),
                     [](const AttentionGroup& a, const AttentionGroup& b) {
                       return a.manager->spec().is_full_attention() &&
                              !b.manager->spec().is_full_attention();
                     });
    if (o.policy == EvictionPolicy::kHybridKV) {
      pool.set_unhashed_first(true);
      int32_t attention = -1;
      for (size_t g = 0; g < c.groups.size() && attention < 0; ++g) {
        if (c.groups[g].spec.is_full_attention()) attention = static_cast<int32_t>(g);
      }
      for (auto& m : managers)
        m->EnableStateRetention(attention);
    }
  }

  Status CheckHashBlockSize(const Request& r) const {
    if (r.hash_block_size() == config.hash_block_size) return Status::Ok();
    return Status::InvalidArgument(
        fmt::format("vllm manager: request {}: its hash block size {} is not the manager's {}",
                    r.id(), r.hash_block_size(), config.hash_block_size));
  }

  HashView HashesFor(const Request& r, int32_t block_size) const {
    return HashView(r.block_hashes(), block_size / r.hash_block_size());
  }

  ComputedBlocks FindLongestCacheHit(const Request& r, int64_t max_length) const {
    ComputedBlocks out;
    out.blocks.groups.resize(managers.size());
    if (!hybrid) {
      SingleTypeManager& m = *managers[0];
      const int32_t gid = 0;
      m.FindLongestCacheHit(HashesFor(r, m.block_size()), max_length, {&gid, 1}, m.block_size(),
                            out.blocks.groups);
      out.num_tokens = static_cast<int64_t>(out.blocks.groups[0].size()) * m.block_size();
      return out;
    }
    std::vector<char> found(managers.size(), 0);
    std::vector<BlockList> hits;
    const bool simple =
        attention_groups.size() == 2 && attention_groups[0].manager->spec().is_full_attention();
    int64_t hit_length = max_length;
    for (;;) {
      int64_t curr = hit_length;
      for (const AttentionGroup& a : attention_groups) {
        const SingleTypeManager& m = *a.manager;
        if (m.spec().is_full_attention() && found[static_cast<size_t>(a.group_ids[0])]) {
          curr = curr / m.block_size() * m.block_size();
          continue;
        }
        hits.assign(a.group_ids.size(), {});
        m.FindLongestCacheHit(HashesFor(r, m.block_size()), curr, a.group_ids, lcm_block_size,
                              hits);
        curr = static_cast<int64_t>(hits[0].size()) * m.block_size();
        for (size_t k = 0; k < a.group_ids.size(); ++k) {
          out.blocks.groups[static_cast<size_t>(a.group_ids[k])] = std::move(hits[k]);
          found[static_cast<size_t>(a.group_ids[k])] = 1;
        }
      }
      if (curr >= hit_length) break;
      hit_length = curr;
      if (simple) break;
    }
    const AttentionGroup& first = attention_groups[0];
    if (first.manager->spec().is_full_attention()) {
      const auto n = static_cast<size_t>(hit_length / first.manager->block_size());
      for (const int32_t g : first.group_ids) {
        auto& blocks = out.blocks.groups[static_cast<size_t>(g)];
        if (blocks.size() > n) blocks.resize(n);
      }
    }
    out.num_tokens = hit_length;
    return out;
  }

  int64_t NumBlocksToAllocate(RequestId id, int64_t num_tokens, const GroupBlocks* new_computed,
                              int64_t total_computed, int64_t main, bool cap) {
    int64_t n = 0;
    for (size_t g = 0; g < managers.size(); ++g) {
      std::span<const int32_t> nc;
      if (new_computed != nullptr) nc = new_computed->groups[g];
      n += managers[g]->NumBlocksToAllocate(id, num_tokens, nc, total_computed, main, cap);
    }
    return n;
  }

  // Caching up to `num_tokens` reads the block hashes of every full block before it.
  Status CheckCacheable(const Request& r, int64_t num_tokens) const {
    const int64_t needed = num_tokens / config.hash_block_size;
    if (static_cast<int64_t>(r.block_hashes().size()) >= needed) return Status::Ok();
    return Status::InvalidArgument(
        fmt::format("vllm manager: request {}: caching {} tokens needs {} block hashes, it has {}",
                    r.id(), num_tokens, needed, r.block_hashes().size()));
  }

  void CacheBlocks(const Request& r, int64_t num_computed) {
    if (!options.enable_caching) return;
    if (!hybrid) {
      managers[0]->CacheBlocks(r, num_computed, 0);
      return;
    }
    const int64_t aligned = num_computed / lcm_block_size * lcm_block_size;
    for (auto& m : managers)
      m->CacheBlocks(r, aligned, lcm_block_size);
  }
};

KvCacheManager::KvCacheManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

Result<KvCacheManager> KvCacheManager::Create(const KvCacheConfig& config,
                                              const ManagerOptions& options) {
  const auto bad = [](const std::string& what) {
    return Status::InvalidArgument(
        fmt::format("vllm manager: {} (make the config with MakeKvCacheConfig)", what));
  };
  if (config.groups.empty()) return bad("the config has no KV cache group");
  if (config.num_blocks < 2)
    return bad(fmt::format("{} blocks; at least 2 (one is the null block)", config.num_blocks));
  if (config.hash_block_size < 1)
    return bad(fmt::format("hash block size {}; at least 1", config.hash_block_size));
  if (config.max_model_len < 2)
    return bad(fmt::format("max model len {}; at least 2", config.max_model_len));
  if (config.max_num_batched_tokens < 1)
    return bad(fmt::format("{} batched tokens; at least 1", config.max_num_batched_tokens));
  for (const KvCacheGroup& g : config.groups) {
    if (g.spec.block_size < 1) {
      return bad(fmt::format("group block size {}; at least 1", g.spec.block_size));
    }
    if (g.spec.block_size % config.hash_block_size != 0) {
      return Status::InvalidArgument(fmt::format(
          "vllm manager: group block size {} is not a multiple of the hash block size {}",
          g.spec.block_size, config.hash_block_size));
    }
  }
  return KvCacheManager(std::make_unique<Impl>(config, options));
}

const KvCacheConfig& KvCacheManager::config() const {
  return impl_->config;
}

Result<ComputedBlocks> KvCacheManager::GetComputedBlocks(const Request& request) const {
  HKV_RETURN_IF_ERROR(impl_->CheckHashBlockSize(request));
  if (!impl_->options.enable_caching) {
    ComputedBlocks none;
    none.blocks.groups.resize(impl_->managers.size());
    return none;
  }
  return impl_->FindLongestCacheHit(request, request.num_tokens() - 1);
}

Status KvCacheManager::AllocateSlots(const Request& request, const AllocateArgs& a,
                                     GroupBlocks* new_blocks) {
  Impl& m = *impl_;
  const auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(fmt::format("vllm manager: request {}: {}", request.id(), what));
  };
  const std::pair<int64_t, const char*> counts[] = {
      {a.num_new_tokens, "new tokens"},
      {a.num_new_computed_tokens, "new computed tokens"},
      {a.num_lookahead_tokens, "lookahead tokens"},
      {a.num_external_computed_tokens, "external computed tokens"}};
  for (const auto& [n, what] : counts) {
    if (n < 0) return bad(fmt::format("{} {}; expected at least 0", n, what));
  }
  if (a.num_new_tokens == 0 && a.num_external_computed_tokens == 0)
    return bad("0 new tokens and 0 external computed tokens; expected at least 1 new token");
  // No bound against the request's tokens: vLLM's scheduler asks for slots past them (draft
  // tokens, the async scheduler's output placeholders); only caching stops at num_tokens, and
  // slots stop at max_model_len.
  const int64_t local_computed = request.num_computed_tokens + a.num_new_computed_tokens;
  HKV_RETURN_IF_ERROR(m.CheckHashBlockSize(request));
  const GroupBlocks* nc = a.new_computed != nullptr && !a.new_computed->blocks.empty()
                              ? &a.new_computed->blocks
                              : nullptr;
  if (nc != nullptr && nc->groups.size() != m.managers.size()) {
    return bad(fmt::format("computed blocks for {} groups, the manager has {}", nc->groups.size(),
                           m.managers.size()));
  }
  const int64_t max_len = m.config.max_model_len;
  const int64_t with_external = local_computed + a.num_external_computed_tokens;
  const int64_t total_computed = std::min(with_external, max_len);
  const bool cache = m.options.enable_caching && !a.delay_cache_blocks;
  const int64_t to_cache = std::min(total_computed + a.num_new_tokens, request.num_tokens());
  if (cache) HKV_RETURN_IF_ERROR(m.CheckCacheable(request, to_cache));
  const int64_t free = m.pool.num_free();
  if (a.full_sequence_must_fit) {
    const int64_t full = std::min(request.num_tokens(), max_len);
    if (m.NumBlocksToAllocate(request.id(), full, nc, total_computed, full, true) > free)
      return Status::ResourceExhausted("vllm manager: the whole sequence does not fit");
  }
  const int64_t main = total_computed + a.num_new_tokens;
  const int64_t need_slot = std::min(main + a.num_lookahead_tokens, max_len);
  // As in vLLM, blocks that left the window are released before the check, whatever its outcome.
  for (auto& s : m.managers)
    s->RemoveSkippedBlocks(request.id(), total_computed);
  if (m.NumBlocksToAllocate(request.id(), need_slot, nc, with_external, main, false) >
      m.pool.num_free()) {
    return Status::ResourceExhausted("vllm manager: not enough free blocks");
  }
  if (nc != nullptr || a.num_external_computed_tokens > 0) {
    static const std::vector<int32_t> kNone;
    for (size_t g = 0; g < m.managers.size(); ++g) {
      m.managers[g]->AllocateNewComputedBlocks(request.id(), nc != nullptr ? nc->groups[g] : kNone,
                                               local_computed, a.num_external_computed_tokens);
    }
  }
  if (new_blocks != nullptr) {
    // Cleared, not reassigned: a caller that reuses `new_blocks` keeps its lists' capacity.
    new_blocks->groups.resize(m.managers.size());
    for (auto& g : new_blocks->groups)
      g.clear();
  }
  for (size_t g = 0; g < m.managers.size(); ++g) {
    m.managers[g]->AllocateNewBlocks(request.id(), need_slot, main,
                                     new_blocks != nullptr ? &new_blocks->groups[g] : nullptr);
  }
  if (cache) m.CacheBlocks(request, to_cache);
  return Status::Ok();
}

void KvCacheManager::Free(RequestId id) {
  for (auto& s : impl_->managers)
    s->Free(id);
}

Status KvCacheManager::CacheBlocks(const Request& request, int64_t num_computed_tokens) {
  Impl& m = *impl_;
  if (num_computed_tokens < 0 || num_computed_tokens > request.num_tokens()) {
    return Status::InvalidArgument(
        fmt::format("vllm manager: request {}: cache {} tokens; it has {}", request.id(),
                    num_computed_tokens, request.num_tokens()));
  }
  HKV_RETURN_IF_ERROR(m.CheckHashBlockSize(request));
  if (!m.options.enable_caching) return Status::Ok();
  HKV_RETURN_IF_ERROR(m.CheckCacheable(request, num_computed_tokens));
  m.CacheBlocks(request, num_computed_tokens);
  return Status::Ok();
}

void KvCacheManager::RemoveSkippedBlocks(RequestId id, int64_t total_computed_tokens) {
  for (auto& s : impl_->managers)
    s->RemoveSkippedBlocks(id, total_computed_tokens);
}

Status KvCacheManager::EvictBlocks(std::span<const int32_t> block_ids) {
  for (const int32_t b : block_ids) {
    if (b < 0 || b >= impl_->pool.num_blocks()) {
      return Status::InvalidArgument(fmt::format(
          "vllm manager: evict block {}: ids run from 0 to {}", b, impl_->pool.num_blocks() - 1));
    }
  }
  for (const int32_t b : block_ids)
    impl_->pool.EvictCached(b);
  return Status::Ok();
}

std::vector<CacheEvent> KvCacheManager::TakeEvents() {
  std::vector<CacheEvent> out;
  out.swap(impl_->events);
  return out;
}

void KvCacheManager::NewStepStarts() {
  for (auto& s : impl_->managers)
    s->NewStepStarts();
}

std::vector<int32_t> KvCacheManager::NumCommonPrefixBlocks(RequestId id) const {
  // Without prefix caching vLLM's coordinator answers 0 for every group.
  if (!impl_->options.enable_caching) return std::vector<int32_t>(impl_->managers.size(), 0);
  std::vector<int32_t> out;
  for (const auto& s : impl_->managers)
    out.push_back(s->NumCommonPrefixBlocks(id));
  return out;
}

GroupBlocks KvCacheManager::GetBlockIds(RequestId id) const {
  GroupBlocks out;
  for (const auto& s : impl_->managers) {
    const BlockList* b = s->blocks_of(id);
    out.groups.push_back(b != nullptr ? *b : BlockList{});
  }
  return out;
}

std::vector<int32_t> KvCacheManager::TakeNewBlockIds() {
  std::vector<int32_t> ids;
  for (auto& s : impl_->managers) {
    const std::vector<int32_t> g = s->TakeNewBlockIds();
    ids.insert(ids.end(), g.begin(), g.end());
  }
  return ids;
}

bool KvCacheManager::ResetPrefixCache() {
  return impl_->pool.ResetPrefixCache();
}

PoolStats KvCacheManager::Stats() const {
  return {impl_->pool.num_blocks(), impl_->pool.num_free(), impl_->pool.num_cached()};
}

bool KvCacheManager::Idle() const {
  return std::all_of(impl_->managers.begin(), impl_->managers.end(),
                     [](const auto& s) { return s->holds_nothing(); });
}

bool KvCacheManager::IsCached(int32_t block) const {
  return block >= 0 && block < impl_->pool.num_blocks() && impl_->pool.has_hash(block);
}

std::vector<int32_t> KvCacheManager::FreeQueue() const {
  return impl_->pool.FreeQueue();
}

Status KvCacheManager::CheckInvariants() const {
  std::vector<int32_t> holders(static_cast<size_t>(impl_->pool.num_blocks()), 0);
  for (const auto& s : impl_->managers)
    s->AddHolders(holders);
  return impl_->pool.Check(holders);
}

}  // namespace hkv::vllm
