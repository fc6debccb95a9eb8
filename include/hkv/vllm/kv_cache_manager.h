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
// Request does. Calls with bad arguments (zero new tokens, negative counts, blocks to cache past
// the request's hashes) return an error and change nothing; slots past the request's tokens are
// granted, as vLLM grants them for draft tokens and output placeholders. With events on, the
// manager records what vLLM's BlockPool would publish (BlockStored per caching call and group,
// BlockRemoved per identity dropped, AllBlocksCleared), in its order; an engine adapter turns them
// into its own event objects.
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

  // A request whose block hashes the engine computes (vLLM's own digests, mapped to BlockHash by
  // the adapter, so extra keys such as LoRA, multimodal items and cache salts count as vLLM
  // counts them). Tokens are counted, not kept.
  static Request Hashed(RequestId id, int64_t num_prompt_tokens, int32_t hash_block_size);
  // The request now has `num_tokens` tokens, and `hashes` follow its known block hashes.
  void Extend(int64_t num_tokens, std::span<const BlockHash> hashes);

  RequestId id() const { return id_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
  // Empty for a Hashed request.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<BlockHash>& block_hashes() const { return hashes_; }
  int32_t hash_block_size() const { return hash_block_size_; }

  int64_t num_computed_tokens = 0;

 private:
  RequestId id_;
  int64_t num_prompt_tokens_;
  int32_t hash_block_size_;
  int64_t num_tokens_ = 0;
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
  // Tokens a KV connector holds (P/D, offload): they get blocks but are neither hit nor cached
  // by this call.
  int64_t num_external_computed_tokens = 0;
  // P/D: blocks will be filled by a transfer later; cache nothing now.
  bool delay_cache_blocks = false;
  bool full_sequence_must_fit = false;
};

// Which free block is evicted next. kVllm is vLLM's own order, call for call (the contract
// above). kHybridKV keeps vLLM's layout, block tables, hit rules and every block id valid, and
// changes only where freed blocks join the free queue (docs/vllm.md, "The hybridkv policy"):
// - a block freed without an identity (a request's partial last block, a state block that never
//   filled) joins the front: it holds nothing a hit could use, so it is reused before any cached
//   block is evicted;
// - a recurrent state a request has moved past (Mamba groups) is evicted first once the request
//   frees a later one, unless another request hit it or shares the prefix it ends (a branch
//   point): a hit needs the state at its exact end, and a chat follow-up hits the last one.
// The outputs then differ from vLLM's (which blocks stay cached), never the validity of a hit.
enum class EvictionPolicy : unsigned char { kVllm, kHybridKV };

struct ManagerOptions {
  bool enable_caching = true;  // vLLM's enable_prefix_caching
  bool record_events = false;  // enable_kv_cache_events
  EvictionPolicy policy = EvictionPolicy::kVllm;
};

// What vLLM's BlockPool queues for take_events, in ids rather than hashes: the adapter knows the
// request, and so its hashes, token ids and extra keys.
struct CacheEvent {
  enum class Kind : unsigned char { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  int32_t group = -1;     // kStored, kRemoved
  RequestId request = 0;  // kStored
  int32_t block_size = 0;
  // kStored: blocks [first_block, end_block) of the group's table became full in one caching
  // call (the event's token range); `blocks` are those given an identity (null and masked
  // blocks are skipped, as vLLM skips them), `indices` their positions in the table.
  int64_t first_block = 0, end_block = 0;
  std::vector<int32_t> blocks;
  std::vector<int64_t> indices;
  // kRemoved: `blocks` holds the one block whose identity was dropped.
};

struct PoolStats {
  int32_t num_blocks = 0;  // including the null block
  int32_t num_free = 0;
  int32_t num_cached = 0;  // blocks holding a prefix identity (held or free)
};

class KvCacheManager {
 public:
  static Result<KvCacheManager> Create(const KvCacheConfig& config,
                                       const ManagerOptions& options = {});
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
  // cache_blocks: caches the request's full blocks up to num_computed_tokens (no-op with
  // caching off). kInvalidArgument past the request's tokens or hashes.
  Status CacheBlocks(const Request& request, int64_t num_computed_tokens);
  // remove_skipped_blocks: blocks left behind a window (or a superseded Mamba state) go back.
  void RemoveSkippedBlocks(RequestId id, int64_t total_computed_tokens);
  // evict_blocks: drops the identities of these blocks (held ones stay held). kInvalidArgument,
  // naming the id, when one is out of range; nothing is evicted then.
  Status EvictBlocks(std::span<const int32_t> block_ids);
  void NewStepStarts();
  std::vector<int32_t> NumCommonPrefixBlocks(RequestId id) const;
  GroupBlocks GetBlockIds(RequestId id) const;
  // take_new_block_ids: full-attention blocks allocated since the last call.
  std::vector<int32_t> TakeNewBlockIds();
  // reset_prefix_cache: false (nothing changed) while any block is held.
  bool ResetPrefixCache();
  PoolStats Stats() const;
  // No request holds a block or a caching record in any group (what vLLM's empty req_to_blocks
  // and num_cached_block maps say after every request is freed).
  bool Idle() const;
  // Whether the block holds a prefix identity (vLLM: block.block_hash is not None). False for
  // ids out of range.
  bool IsCached(int32_t block) const;
  // Events recorded since the last call, oldest first (none unless ManagerOptions::record_events).
  std::vector<CacheEvent> TakeEvents();
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
