#include "single_type_manager.h"

#include <algorithm>

namespace hkv::vllm {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::span<const int32_t> DropFront(std::span<const int32_t> s, int64_t n) {
  return n >= static_cast<int64_t>(s.size())
             ? std::span<const int32_t>{}
             : s.subspan(static_cast<size_t>(std::max<int64_t>(n, 0)));
}

class FullAttentionManager final : public SingleTypeManager {
 public:
  using SingleTypeManager::SingleTypeManager;

  void FindLongestCacheHit(const HashView& hashes, int64_t max_length,
                           std::span<const int32_t> group_ids, int32_t alignment_tokens,
                           std::vector<BlockList>& out) const override {
    const int64_t max_blocks = std::min(max_length / block_size_, hashes.size());
    BlockList found;
    // A prompt's probes are independent table reads: issued a few ahead, their misses overlap.
    constexpr int64_t kAhead = 4;
    auto prefetch = [&](int64_t i) {
      if (i < max_blocks) {
        for (const int32_t g : group_ids)
          pool_->PrefetchCached(PrefixKey{hashes[i], g});
      }
    };
    for (int64_t i = 0; i < kAhead; ++i)
      prefetch(i);
    for (int64_t i = 0; i < max_blocks; ++i) {
      prefetch(i + kAhead);
      if (!GetCachedBlock(hashes[i], group_ids, found)) break;
      for (size_t k = 0; k < group_ids.size(); ++k)
        out[k].push_back(found[k]);
    }
    PopToAlignment(out, group_ids.size(), alignment_tokens);
  }

  int32_t NumCommonPrefixBlocks(RequestId id) const override {
    const RequestTables* t = reqs_.Find(id);
    if (t == nullptr) return 0;
    int32_t n = 0;
    for (const int32_t b : t->blocks) {
      if (pool_->ref_cnt(b) != static_cast<int32_t>(reqs_.size())) break;
      ++n;
    }
    return n;
  }
};

class SlidingWindowManager final : public SingleTypeManager {
 public:
  using SingleTypeManager::SingleTypeManager;

  void FindLongestCacheHit(const HashView& hashes, int64_t max_length,
                           std::span<const int32_t> group_ids, int32_t alignment_tokens,
                           std::vector<BlockList>& out) const override {
    const int64_t needed = CeilDiv(spec_.sliding_window - 1, block_size_);
    const int64_t max_blocks = max_length / block_size_;
    for (size_t k = 0; k < group_ids.size(); ++k)
      out[k].assign(static_cast<size_t>(max_blocks), kNullBlock);
    int64_t contiguous = 0;
    bool match = false;
    BlockList found;
    for (int64_t i = max_blocks - 1; i >= 0; --i) {
      if (GetCachedBlock(hashes[i], group_ids, found)) {
        if (contiguous == 0 && block_size_ != alignment_tokens &&
            (i + 1) * block_size_ % alignment_tokens != 0) {
          continue;
        }
        for (size_t k = 0; k < group_ids.size(); ++k)
          out[k][static_cast<size_t>(i)] = found[k];
        ++contiguous;
        if (contiguous >= needed) {
          for (size_t k = 0; k < group_ids.size(); ++k)
            out[k].resize(static_cast<size_t>(i + contiguous));
          match = true;
          break;
        }
      } else {
        contiguous = 0;
      }
    }
    if (!match) {
      for (size_t k = 0; k < group_ids.size(); ++k)
        out[k].resize(std::min(out[k].size(), static_cast<size_t>(contiguous)));
      PopToAlignment(out, group_ids.size(), alignment_tokens);
    }
  }

 protected:
  int64_t NumSkippedTokens(int64_t n) const override {
    return std::max<int64_t>(0, n - spec_.sliding_window + 1);
  }
  bool CacheMaskSkips(int64_t i, int32_t alignment_tokens) const override {
    const int64_t per_segment = alignment_tokens / block_size_;
    const int64_t tail = CeilDiv(spec_.sliding_window - 1, block_size_);
    if (tail >= per_segment) return false;
    return i % per_segment < per_segment - tail;
  }
};

class ChunkedLocalManager final : public SingleTypeManager {
 public:
  using SingleTypeManager::SingleTypeManager;

  void FindLongestCacheHit(const HashView& hashes, int64_t max_length,
                           std::span<const int32_t> group_ids, int32_t /*alignment_tokens*/,
                           std::vector<BlockList>& out) const override {
    const int64_t max_blocks = max_length / block_size_;
    const int64_t chunk = spec_.attention_chunk_size;
    const int64_t start = max_length > 0 ? max_length / chunk * chunk : 0;
    const int64_t start_block = start / block_size_;
    for (size_t k = 0; k < group_ids.size(); ++k)
      out[k].assign(static_cast<size_t>(start_block), kNullBlock);
    BlockList found;
    for (int64_t i = start_block; i < max_blocks; ++i) {
      if (!GetCachedBlock(hashes[i], group_ids, found)) break;
      for (size_t k = 0; k < group_ids.size(); ++k)
        out[k].push_back(found[k]);
    }
  }

 protected:
  int64_t NumSkippedTokens(int64_t n) const override {
    return n / spec_.attention_chunk_size * spec_.attention_chunk_size;
  }
};

class MambaManager final : public SingleTypeManager {
 public:
  using SingleTypeManager::SingleTypeManager;

  void FindLongestCacheHit(const HashView& hashes, int64_t max_length,
                           std::span<const int32_t> group_ids, int32_t alignment_tokens,
                           std::vector<BlockList>& out) const override {
    const int64_t max_blocks = max_length / block_size_;
    BlockList found;
    for (int64_t i = max_blocks - 1; i >= 0; --i) {
      if (!GetCachedBlock(hashes[i], group_ids, found)) continue;
      if (block_size_ != alignment_tokens && (i + 1) * block_size_ % alignment_tokens != 0)
        continue;
      for (size_t k = 0; k < group_ids.size(); ++k) {
        out[k].assign(static_cast<size_t>(i), kNullBlock);
        out[k].push_back(found[k]);
      }
      break;  // only the last state is needed
    }
  }

  void RemoveSkippedBlocks(RequestId id, int64_t num_computed_tokens) override {
    SingleTypeManager::RemoveSkippedBlocks(id, num_computed_tokens);
    if (retain_) StatesFreed(id, scratch_);  // newest first
    if (!align()) return;
    const auto it = last_state_block_idx_.find(id);
    if (it == last_state_block_idx_.end() ||
        it->second >= CeilDiv(num_computed_tokens, block_size_) - 1) {
      return;
    }
    BlockList& blocks = reqs_[id].blocks;
    int32_t& b = blocks[static_cast<size_t>(it->second)];
    if (b != kNullBlock) {
      const int32_t one[1] = {b};
      pool_->Free(std::begin(one), std::end(one));
      if (retain_) StatesFreed(id, one);
      b = kNullBlock;
    }
  }

  void EnableStateRetention(int32_t attention_group) override {
    retain_ = true;
    attention_group_ = attention_group;
  }

  int64_t NumBlocksToAllocate(RequestId id, int64_t num_tokens,
                              std::span<const int32_t> new_computed, int64_t total_computed_tokens,
                              int64_t num_tokens_main_model, bool apply_admission_cap) override {
    if (!new_computed.empty()) {
      // A state cached in this very step may not be computed yet: never reuse it now.
      const int32_t last = new_computed.back();
      if (pool_->has_hash(last) && cached_this_step_.contains(pool_->key(last)))
        return int64_t{pool_->num_blocks()} + 1;
    }
    if (!align()) {
      return SingleTypeManager::NumBlocksToAllocate(id, num_tokens, new_computed,
                                                    total_computed_tokens, num_tokens_main_model,
                                                    apply_admission_cap);
    }
    const int64_t required = CeilDiv(num_tokens_main_model, block_size_);
    int64_t num_new = required - static_cast<int64_t>(new_computed.size()) -
                      static_cast<int64_t>(reqs_[id].blocks.size());
    if (num_new > 0) num_new = 1;
    return num_new + NumEvictable(new_computed);
  }

  void AllocateNewBlocks(RequestId id, int64_t num_tokens, int64_t num_tokens_main_model,
                         BlockList* out) override {
    if (!align()) {
      SingleTypeManager::AllocateNewBlocks(id, num_tokens, num_tokens_main_model, out);
      return;
    }
    BlockList& blocks = reqs_[id].blocks;
    const int64_t required = CeilDiv(num_tokens_main_model, block_size_);
    const auto prev = static_cast<int64_t>(blocks.size());
    if (required == prev) return;
    const bool allocated = allocated_reqs_.contains(id);
    if (allocated || prev > 0) last_state_block_idx_[id] = prev - 1;
    const int64_t skipped = required - 1;
    if (prev < skipped) blocks.resize(static_cast<size_t>(skipped), kNullBlock);
    const int64_t num_new = required - static_cast<int64_t>(blocks.size());
    pool_->GetNewBlocks(static_cast<int32_t>(num_new), blocks);
    allocated_reqs_.insert(id);
    if (out != nullptr) out->insert(out->end(), blocks.begin() + prev, blocks.end());
  }

  void Free(RequestId id) override {
    if (align()) {
      allocated_reqs_.erase(id);
      last_state_block_idx_.erase(id);
    }
    // The last state a request moved past keeps its place: a follow-up turn hits it.
    if (retain_) latest_freed_.erase(id);
    SingleTypeManager::Free(id);
  }

  void CacheBlocks(const Request& request, int64_t num_tokens, int32_t alignment_tokens) override {
    const int64_t before = NumCached(request.id());
    SingleTypeManager::CacheBlocks(request, num_tokens, alignment_tokens);
    const int64_t after = NumCached(request.id());
    if (after <= before) return;
    const BlockList& blocks = reqs_[request.id()].blocks;
    for (int64_t i = before; i < after && i < static_cast<int64_t>(blocks.size()); ++i) {
      const int32_t b = blocks[static_cast<size_t>(i)];
      if (b != kNullBlock) cached_this_step_.insert(pool_->key(b));
    }
  }

  void NewStepStarts() override { cached_this_step_.clear(); }

 protected:
  int64_t NumSkippedTokens(int64_t n) const override { return n - 1; }

 private:
  // A state block as it was when its request freed it.
  struct FreedState {
    int32_t block = kNullBlock;
    PrefixKey key;
  };

  // `freed` (newest first) left request `id`'s table: every state older than the newest is
  // superseded by the next newer state of the same request.
  void StatesFreed(RequestId id, std::span<const int32_t> freed) {
    if (freed.empty()) return;
    auto [it, fresh] = latest_freed_.try_emplace(id);
    if (!fresh) Supersede(it->second, pool_->key(freed.back()));
    for (size_t i = freed.size() - 1; i >= 1; --i)
      Supersede({freed[i], pool_->key(freed[i])}, pool_->key(freed[i - 1]));
    it->second = {freed[0], pool_->key(freed[0])};
  }

  // Demotes a superseded state that still holds its identity in the free queue, unless it is a
  // branch point: it was hit, or it is the last state on a prefix another request also cached
  // (the attention block ending where it ends is shared and the one ending where `newer` ends
  // is not).
  void Supersede(const FreedState& s, const PrefixKey& newer) {
    const int32_t b = s.block;
    if (b == kNullBlock || !pool_->is_free(b) || !pool_->has_hash(b) || !(pool_->key(b) == s.key))
      return;
    if (pool_->shared(b)) return;
    if (attention_group_ >= 0 && pool_->IdentityShared({s.key.hash, attention_group_}) &&
        !pool_->IdentityShared({newer.hash, attention_group_})) {
      return;
    }
    pool_->Demote(b);
  }

  bool retain_ = false;
  int32_t attention_group_ = -1;
  std::unordered_map<RequestId, FreedState> latest_freed_;

  bool align() const { return spec_.mamba_cache_mode == MambaCacheMode::kAlign; }

  std::unordered_set<PrefixKey, PrefixKeyHash> cached_this_step_;
  std::unordered_map<RequestId, int64_t> last_state_block_idx_;
  std::unordered_set<RequestId> allocated_reqs_;
};

}  // namespace

SingleTypeManager::SingleTypeManager(const KvCacheSpec& spec, BlockPool* pool, int32_t group_id,
                                     int32_t admission_cap_blocks)
    : spec_(spec),
      pool_(pool),
      group_id_(group_id),
      block_size_(spec.block_size),
      admission_cap_(admission_cap_blocks) {}

void SingleTypeManager::PopToAlignment(std::vector<BlockList>& out, size_t groups,
                                       int32_t alignment_tokens) const {
  if (block_size_ == alignment_tokens) return;
  while (static_cast<int64_t>(out[0].size()) * block_size_ % alignment_tokens != 0) {
    for (size_t k = 0; k < groups; ++k)
      out[k].pop_back();
  }
}

int64_t SingleTypeManager::NumEvictable(std::span<const int32_t> blocks) const {
  int64_t n = 0;
  for (const int32_t b : blocks)
    n += b != kNullBlock && pool_->ref_cnt(b) == 0;
  return n;
}

bool SingleTypeManager::GetCachedBlock(const BlockHash& hash, std::span<const int32_t> group_ids,
                                       BlockList& found) const {
  found.clear();
  for (const int32_t g : group_ids) {
    const int32_t b = pool_->GetCachedBlock(PrefixKey{hash, g});
    if (b < 0) return false;
    found.push_back(b);
  }
  return true;
}

int64_t SingleTypeManager::NumBlocksToAllocate(RequestId id, int64_t num_tokens,
                                               std::span<const int32_t> new_computed,
                                               int64_t total_computed_tokens,
                                               int64_t /*num_tokens_main_model*/,
                                               bool apply_admission_cap) {
  int64_t required = CeilDiv(num_tokens, block_size_);
  if (apply_admission_cap && admission_cap_ > 0)
    required = std::min<int64_t>(required, admission_cap_);
  const RequestTables* t = reqs_.Find(id);
  const int64_t num_req_blocks = t == nullptr ? 0 : static_cast<int64_t>(t->blocks.size());
  if (t != nullptr && t->num_cached >= 0) return std::max<int64_t>(required - num_req_blocks, 0);
  const int64_t skipped_blocks = NumSkippedTokens(total_computed_tokens) / block_size_;
  const int64_t local_computed = static_cast<int64_t>(new_computed.size()) + num_req_blocks;
  const int64_t num_new = std::max<int64_t>(required - std::max(skipped_blocks, local_computed), 0);
  const int64_t skipped_new_computed = std::max<int64_t>(0, skipped_blocks - num_req_blocks);
  return num_new + NumEvictable(DropFront(new_computed, skipped_new_computed));
}

void SingleTypeManager::AllocateNewComputedBlocks(RequestId id,
                                                  std::span<const int32_t> new_computed,
                                                  int64_t num_local_computed_tokens,
                                                  int64_t num_external_computed_tokens) {
  RequestTables& t = reqs_[id];
  if (t.num_cached >= 0) return;
  BlockList& blocks = t.blocks;
  const int64_t total = num_local_computed_tokens + num_external_computed_tokens;
  const int64_t skipped_tokens = NumSkippedTokens(total);
  const int64_t skipped_blocks = skipped_tokens / block_size_;
  int64_t external = num_external_computed_tokens;
  if (skipped_blocks > 0) {
    new_computed = DropFront(new_computed, skipped_blocks);
    // Connector tokens behind the window need no block either.
    external = std::min(total - skipped_tokens, external);
  }
  for (const int32_t b : new_computed)
    pool_->Touch(b);
  if (skipped_blocks > 0)
    blocks.resize(blocks.size() + static_cast<size_t>(skipped_blocks), kNullBlock);
  blocks.insert(blocks.end(), new_computed.begin(), new_computed.end());
  t.num_cached = static_cast<int64_t>(blocks.size());
  if (external > 0) GrowTo(blocks, CeilDiv(total, block_size_), nullptr);
}

void SingleTypeManager::AllocateNewBlocks(RequestId id, int64_t num_tokens,
                                          int64_t /*num_tokens_main_model*/, BlockList* out) {
  GrowTo(reqs_[id].blocks, CeilDiv(num_tokens, block_size_), out);
}

void SingleTypeManager::GrowTo(BlockList& blocks, int64_t num_blocks, BlockList* out) {
  const int64_t num_new = num_blocks - static_cast<int64_t>(blocks.size());
  if (num_new <= 0) return;
  const size_t first = blocks.size();
  pool_->GetNewBlocks(static_cast<int32_t>(num_new), blocks);
  const auto fresh = blocks.begin() + static_cast<std::ptrdiff_t>(first);
  // take_new_block_ids reports plain full-attention blocks only (vLLM zeroes those).
  if (spec_.type == SpecType::kFullAttention)
    new_block_ids_.insert(new_block_ids_.end(), fresh, blocks.end());
  if (out != nullptr) out->insert(out->end(), fresh, blocks.end());
}

void SingleTypeManager::CacheFullBlocks(const Request& request, BlockList& blocks,
                                        int64_t num_cached, int64_t num_full,
                                        int32_t alignment_tokens) {
  const HashView hashes(request.block_hashes(), block_size_ / request.hash_block_size());
  const bool masked = alignment_tokens > block_size_;
  const int64_t end = std::min<int64_t>(num_full, static_cast<int64_t>(blocks.size()));
  std::vector<CacheEvent>* events = pool_->events();
  CacheEvent* e = nullptr;
  if (events != nullptr) {
    // vLLM queues one BlockStored per call and group, even when every new block is null.
    e = &events->emplace_back();
    e->kind = CacheEvent::Kind::kStored;
    e->group = group_id_;
    e->request = request.id();
    e->block_size = block_size_;
    e->first_block = num_cached;
    e->end_block = num_full;
  }
  for (int64_t i = num_cached; i < end; ++i) {
    const int32_t b = blocks[static_cast<size_t>(i)];
    if (b == kNullBlock || (masked && CacheMaskSkips(i, alignment_tokens))) continue;
    pool_->Cache(b, PrefixKey{hashes[i], group_id_});
    if (e != nullptr) {
      e->blocks.push_back(b);
      e->indices.push_back(i);
    }
  }
}

void SingleTypeManager::CacheBlocks(const Request& request, int64_t num_tokens,
                                    int32_t alignment_tokens) {
  const int64_t num_full = num_tokens / block_size_;
  if (NumCached(request.id()) >= num_full) return;
  RequestTables& t = reqs_[request.id()];
  CacheFullBlocks(request, t.blocks, std::max<int64_t>(t.num_cached, 0), num_full,
                  alignment_tokens);
  t.num_cached = num_full;
}

void SingleTypeManager::Free(RequestId id) {
  const RequestTables* t = reqs_.Find(id);
  if (t == nullptr) return;
  pool_->Free(t->blocks.rbegin(), t->blocks.rend());
  reqs_.Erase(id);
}

void SingleTypeManager::RemoveSkippedBlocks(RequestId id, int64_t total_computed_tokens) {
  scratch_.clear();  // after the call: the blocks it freed, newest first
  const int64_t skipped_tokens = NumSkippedTokens(total_computed_tokens);
  if (skipped_tokens <= 0) return;
  BlockList& blocks = reqs_[id].blocks;
  const int64_t n =
      std::min<int64_t>(skipped_tokens / block_size_, static_cast<int64_t>(blocks.size()));
  for (int64_t i = n - 1; i >= 0; --i) {
    int32_t& b = blocks[static_cast<size_t>(i)];
    if (b == kNullBlock) break;
    scratch_.push_back(b);
    b = kNullBlock;
  }
  pool_->Free(scratch_.begin(), scratch_.end());
}

int32_t SingleTypeManager::NumCommonPrefixBlocks(RequestId /*id*/) const {
  return 0;
}

std::vector<int32_t> SingleTypeManager::TakeNewBlockIds() {
  std::vector<int32_t> ids;
  ids.swap(new_block_ids_);
  return ids;
}

const BlockList* SingleTypeManager::blocks_of(RequestId id) const {
  const RequestTables* t = reqs_.Find(id);
  return t == nullptr ? nullptr : &t->blocks;
}

void SingleTypeManager::AddHolders(std::vector<int32_t>& holders) const {
  for (const auto& [id, tables] : reqs_) {
    for (const int32_t b : tables.blocks) {
      if (b != kNullBlock) ++holders[static_cast<size_t>(b)];
    }
  }
}

std::unique_ptr<SingleTypeManager> MakeSingleTypeManager(const KvCacheSpec& spec, BlockPool* pool,
                                                         int32_t group_id,
                                                         const KvCacheConfig& config) {
  const int64_t batched = config.max_num_batched_tokens;
  switch (spec.type) {
    case SpecType::kFullAttention:
    case SpecType::kMla:
      return std::make_unique<FullAttentionManager>(spec, pool, group_id, 0);
    case SpecType::kSlidingWindow: {
      const int64_t tokens =
          std::min<int64_t>(spec.sliding_window - 1 + batched, config.max_model_len);
      return std::make_unique<SlidingWindowManager>(
          spec, pool, group_id, static_cast<int32_t>(CeilDiv(tokens, spec.block_size) + 1));
    }
    case SpecType::kChunkedLocal: {
      const int64_t tokens =
          std::min<int64_t>(spec.attention_chunk_size + batched, config.max_model_len);
      return std::make_unique<ChunkedLocalManager>(
          spec, pool, group_id, static_cast<int32_t>(CeilDiv(tokens, spec.block_size)));
    }
    case SpecType::kMamba:
      return std::make_unique<MambaManager>(spec, pool, group_id, 0);
  }
  return nullptr;
}

}  // namespace hkv::vllm
