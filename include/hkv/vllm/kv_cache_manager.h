// vllm::KvCacheManager: vLLM v1's KV cache manager (KVCacheManager over a KVCacheCoordinator of
// SingleTypeKVCacheManagers and one BlockPool, at the commit pinned by
// ../shared/vllm_reference), restated in C++ so that hkv's `vllm` allocator mode is vLLM and
// not a model of it.
//
// Contract: every call does what vLLM's method of the same name does, block for block — the
// same block ids from the same free-queue order (LRU, a request's blocks freed tail first,
// cached blocks evicted lazily when popped), blocks cached at allocation (prefix hits within one
// step), duplicate identities kept (block tables stay append-only), sliding-window and chunked
// blocks dropped as they leave the window, Mamba `all` / `align` state blocks, the hybrid
// fixed-point hit search, and the full-sequence admission gate. The recorded logs of the real
// vLLM (tests/data/vllm) are replayed against it request by request in the tests. Block ids
// index the pool (0 is vLLM's null block). Requests are identified by the caller's ids; the
// Request object carries the tokens, their block hashes and num_computed_tokens, as vLLM's
// Request does. Calls with bad arguments (zero new tokens, an unknown request where vLLM would
// fail, counts out of range) return an error and change nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/block_hash.h>
#include <hkv/vllm/kv_cache_config.h>

namespace hkv::vllm {

using RequestId = int64_t;

// The request-side state vLLM's manager reads: tokens, their chained block hashes at the hash
// block size (full blocks only, extended as tokens are appended) and the computed count the
// scheduler advances. A hash block size below 1 hashes nothing; the manager refuses such a
// request by name.
class Request {
 public:
  Request(RequestId id, std::span<const int32_t> prompt, int32_t hash_block_size);
  void AppendToken(int32_t token);

  RequestId id() const { return id_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<BlockHash>& block_hashes() const { return hashes_; }
  int32_t hash_block_size() const { return hash_block_size_; }

  int64_t num_computed_tokens = 0;

 private:
  RequestId id_;
  int64_t num_prompt_tokens_;
  int32_t hash_block_size_;
  std::vector<int32_t> tokens_;
  std::vector<BlockHash> hashes_;
};

// Block ids per KV cache group (vLLM's KVCacheBlocks as ids; 0 is the null block).
struct GroupBlocks {
  std::vector<std::vector<int32_t>> groups;
  bool empty() const;
};

struct ComputedBlocks {
  GroupBlocks blocks;
  int64_t num_tokens = 0;  // prefix-hit tokens
};

struct AllocateArgs {
  int64_t num_new_tokens = 0;
  int64_t num_new_computed_tokens = 0;
  const ComputedBlocks* new_computed = nullptr;  // from GetComputedBlocks, at admission
  int64_t num_lookahead_tokens = 0;
  bool full_sequence_must_fit = false;
};

struct PoolStats {
  int32_t num_blocks = 0;  // including the null block
  int32_t num_free = 0;
  int32_t num_cached = 0;  // blocks holding a prefix identity (held or free)
};

class KvCacheManager {
 public:
  static Result<KvCacheManager> Create(const KvCacheConfig& config);
  KvCacheManager(KvCacheManager&&) noexcept;
  KvCacheManager& operator=(KvCacheManager&&) noexcept;
  ~KvCacheManager();

  const KvCacheConfig& config() const;

  // get_computed_blocks: the longest cached prefix (at most num_tokens - 1 tokens).
  // kInvalidArgument when the request hashes at another block size than the manager.
  Result<ComputedBlocks> GetComputedBlocks(const Request& request) const;
  // allocate_slots: kResourceExhausted (vLLM returns None) when the free blocks do not suffice;
  // `new_blocks` (optional) receives the blocks allocated for this call per group. As in vLLM,
  // blocks that left a sliding window or chunk (and a Mamba `align` state superseded by the
  // computed position) are released before the count, so even a refused call may have released
  // them; a refused call allocates nothing.
  Status AllocateSlots(const Request& request, const AllocateArgs& args,
                       GroupBlocks* new_blocks = nullptr);
  // free: a request's blocks return to the free queue, tail first. Unknown ids are a no-op, as
  // in vLLM (a request that was never allocated holds nothing).
  void Free(RequestId id);
  void NewStepStarts();
  std::vector<int32_t> NumCommonPrefixBlocks(RequestId id) const;
  GroupBlocks GetBlockIds(RequestId id) const;
  // take_new_block_ids: full-attention blocks allocated since the last call.
  std::vector<int32_t> TakeNewBlockIds();
  // reset_prefix_cache: false (nothing changed) while any block is held.
  bool ResetPrefixCache();
  PoolStats Stats() const;
  // Free queue from first-evicted to last (tests).
  std::vector<int32_t> FreeQueue() const;
  // Ref counts equal holders, the free queue holds exactly the unheld blocks, the prefix map
  // points only at blocks with that identity, no block is both null and held by a group.
  Status CheckInvariants() const;

 private:
  struct Impl;
  explicit KvCacheManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hkv::vllm
