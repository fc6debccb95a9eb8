// SingleTypeManager: vLLM's SingleTypeKVCacheManager family — the per-group block lists of every
// request and the rules of one KV cache spec type: how many blocks a step needs, which blocks
// fall out of use (skipped tokens), how hits are found and which full blocks are cached.
// One class per spec type (full attention, sliding window, chunked local, Mamba); the
// coordinator above combines them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <hkv/vllm/kv_cache_manager.h>

#include "block_pool.h"

namespace hkv::vllm {

// A request's block hashes seen at a group's block size (a multiple of the hash block size): a
// block's identity is its last sub-block's chained digest, which covers the whole prefix.
class HashView {
 public:
  HashView(const std::vector<BlockHash>& hashes, int32_t ratio) : h_(hashes), ratio_(ratio) {}
  int64_t size() const { return static_cast<int64_t>(h_.size()) / ratio_; }
  const BlockHash& operator[](int64_t i) const {
    return h_[static_cast<size_t>((i + 1) * ratio_ - 1)];
  }

 private:
  const std::vector<BlockHash>& h_;
  int32_t ratio_;
};

using BlockList = std::vector<int32_t>;

class SingleTypeManager {
 public:
  SingleTypeManager(const KvCacheSpec& spec, BlockPool* pool, int32_t group_id,
                    int32_t admission_cap_blocks);
  virtual ~SingleTypeManager() = default;

  const KvCacheSpec& spec() const { return spec_; }
  int32_t block_size() const { return block_size_; }

  virtual int64_t NumBlocksToAllocate(RequestId id, int64_t num_tokens,
                                      std::span<const int32_t> new_computed,
                                      int64_t total_computed_tokens, int64_t num_tokens_main_model,
                                      bool apply_admission_cap);
  void AllocateNewComputedBlocks(RequestId id, std::span<const int32_t> new_computed,
                                 int64_t num_local_computed_tokens,
                                 int64_t num_external_computed_tokens);
  // Blocks (at this group's size) a caching call up to num_tokens would give an identity to.
  int64_t NumFullBlocks(int64_t num_tokens) const { return num_tokens / block_size_; }
  virtual void AllocateNewBlocks(RequestId id, int64_t num_tokens, int64_t num_tokens_main_model,
                                 BlockList* out);
  virtual void CacheBlocks(const Request& request, int64_t num_tokens, int32_t alignment_tokens);
  virtual void Free(RequestId id);
  virtual void RemoveSkippedBlocks(RequestId id, int64_t total_computed_tokens);
  virtual int32_t NumCommonPrefixBlocks(RequestId id) const;
  virtual void NewStepStarts() {}
  // The hybridkv policy (EvictionPolicy::kHybridKV) for the groups it concerns: a Mamba group
  // demotes the states a request has moved past; `attention_group` (or -1) is the full-attention
  // group whose identities tell a shared prefix. Other groups ignore it.
  virtual void EnableStateRetention(int32_t /*attention_group*/) {}
  // find_longest_cache_hit for the groups `group_ids` sharing this spec; `out[k]` gets group
  // group_ids[k]'s hit blocks.
  virtual void FindLongestCacheHit(const HashView& hashes, int64_t max_length,
                                   std::span<const int32_t> group_ids, int32_t alignment_tokens,
                                   std::vector<BlockList>& out) const = 0;

  std::vector<int32_t> TakeNewBlockIds();
  const BlockList* blocks_of(RequestId id) const;
  void AddHolders(std::vector<int32_t>& holders) const;
  int64_t num_requests() const { return static_cast<int64_t>(reqs_.size()); }
  bool holds_nothing() const { return reqs_.empty(); }

 protected:
  virtual int64_t NumSkippedTokens(int64_t /*num_computed_tokens*/) const { return 0; }
  // Blocks of new_full range a hybrid lookup can never hit (sliding-window interiors).
  virtual bool CacheMaskSkips(int64_t /*block_index*/, int32_t /*alignment_tokens*/) const {
    return false;
  }
  int64_t NumEvictable(std::span<const int32_t> blocks) const;
  // Drops hit blocks from the end until the hit is a multiple of `alignment_tokens`.
  void PopToAlignment(std::vector<BlockList>& out, size_t groups, int32_t alignment_tokens) const;
  // Finds whether every group in group_ids caches `hash`; fills `found` (one block per group).
  bool GetCachedBlock(const BlockHash& hash, std::span<const int32_t> group_ids,
                      BlockList& found) const;
  void CacheFullBlocks(const Request& request, BlockList& blocks, int64_t num_cached,
                       int64_t num_full, int32_t alignment_tokens);
  // Appends fresh blocks until `blocks` holds num_blocks; `out` (optional) gets them too.
  void GrowTo(BlockList& blocks, int64_t num_blocks, BlockList* out);
  // num_cached_block.get(id, 0).
  int64_t NumCached(RequestId id) const {
    const RequestTables* t = reqs_.Find(id);
    return t == nullptr ? 0 : std::max<int64_t>(t->num_cached, 0);
  }

  KvCacheSpec spec_;
  BlockPool* pool_;
  int32_t group_id_;
  int32_t block_size_;
  int32_t admission_cap_;  // blocks; 0: none
  // vLLM's req_to_blocks and num_cached_block, in one map so a call looks a request up once:
  // num_cached < 0 stands for "absent from num_cached_block" (vLLM sets it only where the
  // request already has a block list).
  struct RequestTables {
    BlockList blocks;
    int64_t num_cached = -1;
  };
  // The map plus the last entry looked up: one allocate_slots call asks for the same request
  // three or four times, and the map's nodes stay put until erased.
  class RequestMap {
   public:
    const RequestTables* Find(RequestId id) const {
      if (last_ != nullptr && last_id_ == id) return last_;
      const auto it = map_.find(id);
      if (it == map_.end()) return nullptr;
      return Remember(id, &it->second);
    }
    RequestTables& operator[](RequestId id) {
      if (last_ != nullptr && last_id_ == id) return *last_;
      return *Remember(id, &map_[id]);
    }
    void Erase(RequestId id) {
      if (last_id_ == id) last_ = nullptr;
      map_.erase(id);
    }
    size_t size() const { return map_.size(); }
    bool empty() const { return map_.empty(); }
    auto begin() const { return map_.begin(); }
    auto end() const { return map_.end(); }

   private:
    // The cached pointer is into map_, which this object owns; const lookups may set it.
    RequestTables* Remember(RequestId id, const RequestTables* t) const {
      last_id_ = id;
      last_ = const_cast<RequestTables*>(t);
      return last_;
    }
    std::unordered_map<RequestId, RequestTables> map_;
    mutable RequestId last_id_ = 0;
    mutable RequestTables* last_ = nullptr;
  };
  RequestMap reqs_;
  std::vector<int32_t> new_block_ids_;
  BlockList scratch_;
};

std::unique_ptr<SingleTypeManager> MakeSingleTypeManager(const KvCacheSpec& spec, BlockPool* pool,
                                                         int32_t group_id,
                                                         const KvCacheConfig& config);

}  // namespace hkv::vllm
