// BlockPool: vLLM's block pool — blocks with ref counts, the free queue in eviction order (a
// doubly linked list through the block metadata, first = evicted first), and the prefix map
// from (hash, group) to the blocks that hold it, duplicates included in insertion order.
//
// Contract: block 0 is the null block and is never free; GetNewBlocks pops from the front and
// drops a popped block's identity (lazy eviction); Free appends blocks whose count reaches zero
// in the order given; Touch takes a cached block off the free queue. Nothing allocates per call
// beyond the output vectors.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/prefix_index.h>
#include <hkv/vllm/kv_cache_manager.h>

namespace hkv::vllm {

inline constexpr int32_t kNullBlock = 0;

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return num_free_; }
  int32_t num_cached() const { return cached_.size() + num_duplicates_; }

  // First block caching `key`, or -1.
  int32_t GetCachedBlock(const PrefixKey& key) const { return cached_.Find(key); }
  // Starts loading where GetCachedBlock(key) will look, for loops that know their next keys.
  void PrefetchCached(const PrefixKey& key) const { cached_.Prefetch(key); }
  void Cache(int32_t block, const PrefixKey& key);
  // Pops `n` blocks from the front (n <= num_free()), each with ref count 1.
  void GetNewBlocks(int32_t n, std::vector<int32_t>& out);
  void Touch(int32_t block);
  // Decrements each block; those reaching zero join the queue's tail in the given order (with
  // unhashed_first, those without an identity join its front instead).
  template <typename It>
  void Free(It begin, It end) {
    for (It it = begin; it != end; ++it) {
      if (*it != kNullBlock) --meta_[static_cast<size_t>(*it)].ref_cnt;
    }
    for (It it = begin; it != end; ++it) {
      if (*it == kNullBlock) continue;
      const Meta& m = meta_[static_cast<size_t>(*it)];
      if (m.ref_cnt != 0) continue;
      if (unhashed_first_ && !m.has_hash) {
        Prepend(*it);
      } else {
        Append(*it);
      }
    }
  }
  // The hybridkv policy's retention: blocks freed without an identity are evicted first.
  void set_unhashed_first(bool on) { unhashed_first_ = on; }
  // Moves a free block to the queue's front (evicted next); a held block is left as it is.
  void Demote(int32_t block);
  // The block's identity was cached by more than one request, or served a hit (a prefix that
  // more than one request reached).
  bool shared(int32_t block) const { return meta_[static_cast<size_t>(block)].shared; }
  bool IdentityShared(const PrefixKey& key) const {
    const int32_t b = cached_.Find(key);
    return b >= 0 && meta_[static_cast<size_t>(b)].shared;
  }
  bool ResetPrefixCache();
  // _maybe_evict_cached_block: drops the block's identity if the prefix map holds it.
  void EvictCached(int32_t block) { MaybeEvict(block); }

  // Where events go (nullptr: none are recorded).
  void set_events(std::vector<CacheEvent>* events) { events_ = events; }
  std::vector<CacheEvent>* events() const { return events_; }

  int32_t ref_cnt(int32_t block) const { return meta_[static_cast<size_t>(block)].ref_cnt; }
  bool has_hash(int32_t block) const { return meta_[static_cast<size_t>(block)].has_hash; }
  const PrefixKey& key(int32_t block) const { return meta_[static_cast<size_t>(block)].key; }
  bool is_free(int32_t block) const;

  std::vector<int32_t> FreeQueue() const;
  // Queue links, ref counts against `holders` (per block, from the managers), prefix map.
  Status Check(const std::vector<int32_t>& holders) const;

 private:
  struct Meta {
    int32_t prev = -1, next = -1;  // free queue links; -1 while held
    int32_t ref_cnt = 0;
    int32_t dup_next = -1;  // next block with the same identity, in insertion order
    bool has_hash = false;
    bool shared = false;  // see shared()
    PrefixKey key;
  };
  void LinkAfter(int32_t block, int32_t prev);  // into the queue, after `prev` (or head_)
  void Append(int32_t block);
  void Prepend(int32_t block);
  void Unlink(int32_t block);
  void MaybeEvict(int32_t block);

  std::vector<Meta> meta_;  // num_blocks_ real blocks, then the queue's head and tail sentinels
  int32_t num_blocks_;
  int32_t head_, tail_;
  int32_t num_free_ = 0;
  PrefixIndex cached_;
  int32_t num_duplicates_ = 0;
  std::vector<CacheEvent>* events_ = nullptr;
  bool unhashed_first_ = false;
};

}  // namespace hkv::vllm
