// CacheCore: what the coordinator and every group manager share - the config, the pools (and
// the slab arena under them), the request identities the prefix index is keyed by, the
// checkpoint policy, and the one way blocks are acquired, published and released.
//
// Private to src/manager. Group managers never own blocks themselves: every reference they take
// or drop goes through AcquireHeld / Release here, so the release order (blocks without an
// identity to the free-list head, the rest by the request's retention) is decided in one place.
// Scratch buffers live here too, so steady state allocates nothing whichever group runs.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <hkv/manager/kv_cache_manager.h>
#include <hkv/pool/block_pool.h>
#include <hkv/pool/slab_arena.h>

#include "checkpoint_coverage.h"
#include "request_state.h"
#include "thrash_guard.h"

namespace hkv::manager_internal {

// Internal consistency failures are bugs, not caller errors: stop loudly rather than continue
// with corrupted reference counts.
void Must(const Status& s);

// How many keys ahead a loop of prefix-index lookups prefetches (PrefixIndex::Prefetch): enough
// to overlap the round trips to memory of a table larger than the caches.
constexpr int64_t kFindAhead = 8;

inline int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Block index and offset of a position (>= 0) for one block size. Block sizes are nearly always
// powers of two, and the per-step paths (a decode token's free-step check, its slot) then shift
// and mask instead of dividing: a 64-bit division costs tens of cycles, the rest of such a step
// a few hundred.
class BlockMath {
 public:
  explicit BlockMath(int64_t block_tokens)
      : bs_(block_tokens),
        shift_(std::has_single_bit(static_cast<uint64_t>(block_tokens))
                   ? std::countr_zero(static_cast<uint64_t>(block_tokens))
                   : -1) {}
  int64_t tokens() const { return bs_; }
  int64_t Block(int64_t p) const { return shift_ >= 0 ? p >> shift_ : p / bs_; }
  int64_t Offset(int64_t p) const { return shift_ >= 0 ? p & (bs_ - 1) : p % bs_; }

 private:
  int64_t bs_;
  int shift_;
};

struct CacheCore {
  explicit CacheCore(const ManagerConfig& c);

  // ---- identities: a block of a token group is named by the digest of the tokens up to its
  // end, a state by the digest up to its position; keys are namespaced by group.
  const BlockHash& HashAt(const Request& r, int64_t position) const {
    return r.hashes[static_cast<size_t>(hash_math.Block(position) - 1)];
  }
  PrefixKey TokenKey(const Request& r, int32_t group, int64_t block) const {
    const int64_t bs = config.groups[static_cast<size_t>(group)].block_tokens;
    return {HashAt(r, (block + 1) * bs), group};
  }
  PrefixKey StateKey(const Request& r, int32_t group, int64_t position) const {
    return {HashAt(r, position), group};
  }
  void ExtendHashes(Request& r);
  void ComputeEncoderHashes(Request& r);

  // ---- the checkpoint policy (manager_config.h).
  bool IsCheckpoint(const Request& r, int64_t position) const;
  // Rolling states are kept at multiples of this (ManagerConfig::rolling_stride_after_give_back).
  int64_t RollingStride(const Request& r) const {
    return r.rolling_stride > 0 ? r.rolling_stride : align;
  }
  // The last aligned position before the prompt's end: what an identical prompt would hit.
  int64_t PromptCheckpoint(const Request& r) const { return (r.prompt_len - 1) / align * align; }
  // A checkpoint taken only because its position is a multiple of checkpoint_interval.
  bool IsIntervalOnly(const Request& r, int64_t position) const;
  // Positions in [begin, end) after which a step must copy the recurrent state aside.
  void PlanSnapshots(const Request& r, int64_t begin, int64_t end, int64_t divergence,
                     std::vector<int64_t>& out) const;

  // ---- block movement.
  // A block is available to a hit when the pool caches it or, during Lookup(id, external),
  // when `external` has it.
  // With `block`: the pool's block for the key (-1 when only the external store has it).
  bool Available(const BlockPool& bp, const PrefixKey& key, int32_t* block = nullptr) const {
    const int32_t b = bp.Find(key);
    if (block != nullptr) *block = b;
    return b >= 0 || (external != nullptr && ExternalHas(key));
  }
  // The store's answer for `key`: from the batch Lookup asked up front (AskExternal), else Has.
  bool ExternalHas(const PrefixKey& key) const;
  // Asks the store about every key in external_keys at once (ExternalBlocks::HasMany), keeping
  // the answers for ExternalHas until the next call.
  void AskExternal();
  // Sorts blocks by whether they carry an identity: those without go to the free-list head, the
  // rest follow the request's retention.
  void Release(int32_t pool, std::span<const int32_t> blocks, Retention retention);
  void ReleaseOne(int32_t pool, int32_t block, Retention retention);
  void AcquireHeld(int32_t pool, int32_t block);
  // `r` and `position`: who published it and where (ManagerEvent); a recurrent checkpoint's
  // prefix is also counted as covered (checkpoint_coverage.h).
  // `parent`: a token block's predecessor in the request's table when the caller has it (the
  // null block otherwise: it is looked up when needed).
  // `ahead`: published at Allocate, before the step computes it (BlockPool::Publish's
  // `take_over` off: the copy may yet be withdrawn).
  void PublishBlock(int32_t pool, int32_t block, const PrefixKey& key, const Request& r,
                    int64_t position = -1, int32_t parent = BlockPool::kNullBlock,
                    bool ahead = false);
  // Shared prefixes (ManagerConfig::branch_bonus): the token block `child` starting at
  // `position` took its identity, so its parent gained a continuation; at the second and later
  // ones every block of the prefix up to it, in every decoder token group, and the checkpoints at
  // its end, are marked shared. A checkpoint published at `position` takes the share level of the
  // full-attention block ending there.
  void NoteContinuation(const PrefixKey& child, const Request& r, int64_t position, int32_t parent);
  void ShareCheckpoint(int32_t group, int32_t block, const Request& r, int64_t position);
  // Whether every pool can supply `need` (per pool) while keeping `hit_keep`; with two-level
  // memory, moves slabs so that it can (nothing moves when it cannot). kResourceExhausted
  // naming the short pool otherwise.
  Status ReserveBlocks();
  // The same, answering only whether it succeeded: a waiting request may be refused every step,
  // and the reason is worth formatting once per refused call, not once per try within it.
  bool TryReserveBlocks();
  // Whether TryReserveBlocks would succeed, changing nothing (no slab moves).
  bool CanReserveBlocks();
  bool FixedPoolsFit() const;  // without two-level memory: every need within its pool's free
  std::string arena_shortage;  // two-level memory: why the last TryReserveBlocks failed
  // `n` fresh blocks of `pool` into `fresh` (cleared first); the caller has reserved them.
  std::span<const int32_t> AllocateReserved(int32_t pool, int64_t n);

  // ---- checkpoint coverage (ManagerConfig::evict_uncovered): on for a model with recurrent
  // and full-attention groups, once the pools exist.
  void StartCoverage();
  // Reacts to the identities the pools dropped since the last call (BlockPool::TrackDropped): an
  // evicted checkpoint uncovers attention blocks, which are demoted when no other checkpoint
  // covers them; an evicted attention block that checkpoints still cover leaves the checkpoint
  // ending at it unreachable, which is demoted. Every public call that may evict ends with it.
  void SettleDrops();
  // Coverage's own invariants, and every cached checkpoint counted.
  Status CheckCoverage() const;

  ManagerConfig config;
  int32_t hash_tokens = 1;
  BlockMath hash_math{1};  // hash_tokens: every key a probe or a publish names is found by it
  int32_t align = 1;
  std::vector<BlockPool> pools;
  SlabArena arena;  // two-level memory (config.arena); unused otherwise
  ManagerStats stats;
  const ExternalBlocks* external = nullptr;  // set only inside Lookup(id, external)
  // Lookup(id, external): the keys the groups listed (GroupManager::ExternalCandidates), sorted,
  // and the store's answers (1: has), index for index.
  std::vector<PrefixKey> external_keys;
  std::vector<unsigned char> external_answers;

  // Allocate's plan: blocks each pool must supply, and free hit blocks whose slabs must stay.
  std::vector<int64_t> need;
  std::vector<PoolBlock> hit_keep;

  bool share_branches = false;  // ManagerConfig::branch_bonus is on (KvCacheManager::Create)
  // ManagerConfig::thrash_guard (set by KvCacheManager::Create when on). Its clock is that of
  // `guard_pool` (the arena's pools share one), its residence the cached blocks queued at the
  // tail of every pool on that clock.
  std::unique_ptr<ThrashGuard> guard;
  int32_t guard_pool = 0;
  uint64_t GuardNow() const { return pools[static_cast<size_t>(guard_pool)].clock(); }
  uint64_t GuardResidence() const;
  bool cover = false;
  CheckpointCoverage coverage;
  static constexpr uint8_t kCoverNone = 0, kCoverToken = 1, kCoverState = 2;
  std::vector<uint8_t> group_cover;  // per group: which side of the count it is on
  std::vector<int32_t> cover_token_groups, cover_state_groups;

  // Scratch buffers reused by every call.
  std::vector<MultimodalItem> scratch_items;
  std::vector<int32_t> fresh;       // blocks from BlockPool::Allocate
  std::vector<int32_t> to_release;  // per pool batch
  std::vector<int32_t> release_low, release_normal;
  std::vector<PrefixKey> dropped;
  std::vector<BlockHash> uncovered;
};

}  // namespace hkv::manager_internal
