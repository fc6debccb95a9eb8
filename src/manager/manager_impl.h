// The KvCacheManager's state and the internal operations its public calls are built from.
//
// Private to src/manager. Reference-count ownership, which CheckInvariants verifies, is:
// - every non-null entry of a request's token or encoder table holds one reference;
// - a state group's `live` (if not the null block), `rolling.block`, every `held` snapshot, and
//   during an open step `write` (when it differs from `live`) and every step snapshot hold one
//   reference each. `rolling` may name the live block: it then holds a second reference, which
//   is what makes the next step write its state elsewhere and keeps the rolling state intact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hkv/manager/kv_cache_manager.h>
#include <hkv/pool/block_pool.h>
#include <hkv/pool/slab_arena.h>

#include "request_table.h"

namespace hkv {
namespace manager_internal {

struct HeldState {
  int64_t position = 0;
  int32_t block = 0;  // 0: none
};

struct GroupState {
  // Token and encoder groups.
  std::vector<int32_t> table;  // null for positions the group no longer (or never) keeps
  int32_t num_published = 0;   // leading blocks already offered to the prefix index
  int32_t release_from = 0;    // window/chunk: blocks in [sink blocks, release_from) are null
  // Full-attention groups after Evict (sparse KV): positions dropped from the table, which then
  // indexes cache slots (slot = position - evicted for the positions computed since).
  int64_t evicted = 0;
  // State groups.
  int32_t live = 0;             // the state after `computed` tokens; null when computed == 0
  HeldState rolling;            // newest aligned state reached, published when the request ends
  std::vector<HeldState> held;  // speculative states kept for Truncate, by position
  int32_t read = 0, write = 0;  // open step
  std::vector<StateSnapshot> snaps;  // open step, by position

  void Clear();
};

struct Request {
  static constexpr int64_t kNoLimit = INT64_MAX;
  RequestId id = 0;
  std::vector<int32_t> tokens;    // known tokens
  std::vector<BlockHash> hashes;  // hashes[i]: chain digest of tokens [0, (i+1) * hash_tokens)
  uint64_t adapter = 0;
  std::string salt;
  std::vector<PromptItem> items;  // by position
  int64_t encoder_tokens = 0;
  BlockHash encoder_input;
  std::vector<BlockHash> encoder_hashes;  // per encoder block
  Retention retention = Retention::kNormal;
  int64_t prompt_len = 0;
  // Where the cached attention prefix went further than any cached state at the first Allocate:
  // the state there is checkpointed, so the next request sharing that prefix hits it.
  int64_t divergence = 0;
  // A point where this request's prefix branches from another's, found at the first Allocate:
  // where the cached full-attention prefix went further than the hit (the window or chunk blocks
  // there were evicted, the full-attention ones not), or the hit's end if another running request
  // holds it. The window and chunk blocks needed to continue there are kept until the request
  // ends, so the next request sharing that prefix hits it. 0: none.
  int64_t window_branch = 0;
  // Checkpoints at positions after this one were published by this request (before it: by the
  // request it hit or forked from), so its retention rules may demote them.
  int64_t own_from = 0;
  // Positions at or past this hold KV and state computed after the request evicted tokens
  // (Evict): they are not a function of the tokens alone, so they are never published.
  int64_t publish_until = kNoLimit;
  int64_t computed = 0;
  int64_t reserved = 0;  // token tables cover [0, reserved)
  bool started = false;  // the first Allocate happened
  bool step_open = false;
  bool encoder_ready = false;  // the encoder's blocks hold its KV
  int64_t step_begin = 0, step_end = 0;
  std::vector<BlockCopy> copies;
  // First step of a hit with external blocks, until FinishLoad: the blocks to fill. Each is in
  // the group's table (token groups) or is its live state (state groups), and has no identity.
  std::vector<BlockLoad> loads;
  std::vector<GroupState> groups;

  int64_t known() const { return static_cast<int64_t>(tokens.size()); }
  // What Free and a failed load both forget: the open step, copies, loads and the points found
  // at the first Allocate.
  void ResetProgress() {
    copies.clear();
    loads.clear();
    step_open = false;
    started = false;
    divergence = 0;
    window_branch = 0;
    own_from = 0;
    publish_until = kNoLimit;
  }
};

inline int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline bool ReleasesTokens(const GroupConfig& gc) {
  return gc.rule.kind == TokenRuleKind::kWindow || gc.rule.kind == TokenRuleKind::kChunk;
}

// Groups whose tables follow decoder positions (the encoder group's follow encoder positions).
inline bool IsDecoderTokens(const GroupConfig& gc) {
  return gc.rule.kind == TokenRuleKind::kAll || ReleasesTokens(gc);
}

// Internal consistency failures are bugs, not caller errors: stop loudly rather than continue
// with corrupted reference counts.
void Must(const Status& s);

// Blocks [lo, hi) plus sink blocks [0, sinks) of a token group that hold the positions a group
// needs in order to continue computing at position x.
struct NeededBlocks {
  int64_t lo = 0, hi = 0, sinks = 0;
};

}  // namespace manager_internal

// The manager's own source files (the only includers of this header) use these unqualified.
using manager_internal::CeilDiv;
using manager_internal::GroupState;
using manager_internal::HeldState;
using manager_internal::IsDecoderTokens;
using manager_internal::Must;
using manager_internal::NeededBlocks;
using manager_internal::ReleasesTokens;
using manager_internal::Request;

struct KvCacheManager::Impl {
  using Request = manager_internal::Request;
  using GroupState = manager_internal::GroupState;

  explicit Impl(const ManagerConfig& c);

  // Lookups by id; null when unknown.
  Request* Find(RequestId id);
  const Request* Find(RequestId id) const;
  Status Unknown(const char* call, RequestId id) const;

  // Identity.
  void ExtendHashes(Request& r);
  void ComputeEncoderHashes(Request& r);
  const BlockHash& HashAt(const Request& r, int64_t position) const;
  PrefixKey TokenKey(const Request& r, int32_t group, int64_t block) const;
  PrefixKey StateKey(const Request& r, int32_t group, int64_t position) const;
  bool IsCheckpoint(const Request& r, int64_t position) const;
  // The last aligned position before the prompt's end: what an identical prompt would hit.
  int64_t PromptCheckpoint(const Request& r) const { return (r.prompt_len - 1) / align * align; }
  // A checkpoint taken only because its position is a multiple of checkpoint_interval.
  bool IsIntervalOnly(const Request& r, int64_t position) const;
  // Retention (manager_config.h): demotes the cached, unheld checkpoint of group g at p.
  void DemoteCheckpoint(const Request& r, int32_t group, int64_t position);
  // Commit: demotes the interval checkpoints that those published in (begin, end] push beyond
  // the request's cap.
  void DemoteBeyondCap(const Request& r, int32_t group, int64_t begin, int64_t end);
  // Free: demotes the request's checkpoints that its final state supersedes (`live_position`:
  // where Free published the live state, 0 if it did not).
  void DemoteSupersededCheckpoints(const Request& r, int32_t group, int64_t live_position,
                                   int64_t rolling_position);
  manager_internal::NeededBlocks Needed(int32_t group, int64_t x) const;

  // Hit search (hit_search.cc). A block is available when the pool caches it or, during
  // Lookup(id, external), when `external` has it.
  bool Available(const BlockPool& bp, const PrefixKey& key) const {
    return bp.Find(key) >= 0 || (external != nullptr && external->Has(key));
  }
  // Blocks a hit of `tokens` needs that the pools do not cache (hit.loads).
  int32_t CountLoads(const Request& r, int64_t tokens) const;
  int64_t LookupFixedPoint(const Request& r, int64_t cap, bool token_groups_only = false);
  int64_t DivergenceOf(const Request& r, int64_t hit);
  // Request::window_branch for a request about to take `hit` (before it acquires anything); 0
  // without window or chunk groups, full-attention groups, or coherent eviction.
  int64_t WindowBranchOf(const Request& r, int64_t hit);
  // Releases the window/chunk blocks the next request from slot `from_slot` on (without an open
  // step) keeps for its branch point (and clears its branch point), appending what it did to
  // given_back; advances from_slot past it; false when no request after from_slot keeps any.
  // UndoGiveBack restores every block, table and branch point recorded since given_back was
  // cleared.
  bool GiveBackBranchWindows(size_t& from_slot);
  void UndoGiveBack();
  int64_t TruncateFixedPoint(const Request& r, int64_t x, int64_t new_known) const;
  bool EncoderCached(const Request& r) const;

  // Whether every pool can supply `need` (per pool) while keeping `hit_keep`; with two-level
  // memory, moves slabs so that it can (nothing moves when it cannot). kResourceExhausted
  // naming the short pool otherwise.
  Status ReserveBlocks();

  // Block movement. Release sorts blocks by whether they carry an identity: those without go to
  // the free-list head, the rest follow the request's retention.
  void Release(int32_t pool, std::span<const int32_t> blocks, Retention retention);
  void ReleaseOne(int32_t pool, int32_t block, Retention retention);
  void AcquireHeld(int32_t pool, int32_t block);
  // origin/position: what the stored event says published it (ManagerEvent).
  void PublishBlock(int32_t pool, int32_t block, const PrefixKey& key, RequestId origin = 0,
                    int64_t position = -1);
  void PlanSnapshots(const Request& r, int64_t begin, int64_t end, int64_t divergence,
                     std::vector<int64_t>& out) const;

  // Operations split across files.
  Result<PrefixHit> Lookup(RequestId id, const ExternalBlocks* ext);
  Status Allocate(Request& r, int64_t num_new, const PrefixHit& hit, int64_t lookahead);
  Status Commit(Request& r, int64_t computed);
  Result<TruncateResult> Truncate(Request& r, int64_t n);
  Result<EvictResult> Evict(Request& r, int32_t group, int64_t keep,
                            int64_t unchanged);  // evict.cc
  Status Fork(const Request& parent, RequestId child);
  void FreeRequest(Request& r);
  // FinishLoad(id, false): releases everything the request acquired at its first Allocate.
  void AbandonStart(Request& r);
  Result<CompactionResult> Compact(std::span<const int64_t> max_slabs_per_class);  // compaction.cc
  void ReleaseTokenBlocksCoherently(Request& r);
  Status CheckInvariants() const;

  int32_t NewSlot();

  ManagerConfig config;
  int32_t hash_tokens = 1;
  int32_t align = 1;
  bool has_encoder = false;
  std::vector<BlockPool> pools;
  SlabArena arena;                  // two-level memory (config.arena); unused otherwise
  std::vector<PoolBlock> hit_keep;  // Allocate: free hit blocks whose slabs must stay
  struct GivenBack {
    size_t slot;
    int32_t group;
    size_t index;  // in the group's table
    int32_t block;
  };
  std::vector<GivenBack> given_back;                          // GiveBackBranchWindows' releases
  std::vector<std::pair<size_t, int64_t>> given_back_branch;  // slot, window_branch it had
  CompactionPlan compaction;                                  // Compact: the arena's plan, reused
  std::vector<std::vector<int32_t>> moved_to;  // Compact: per pool, page -> new page (0: none)
  std::vector<Request> requests;               // slots, recycled
  std::vector<int32_t> free_slots;
  manager_internal::RequestTable index;
  ManagerStats stats;
  const ExternalBlocks* external = nullptr;  // set only inside Lookup(id, external)

  // Scratch buffers reused by every call, so steady state allocates nothing.
  std::vector<MultimodalItem> scratch_items;
  std::vector<int64_t> need;        // per pool
  std::vector<int32_t> hit_blocks;  // first Allocate: blocks to acquire, per group in order
                                    // (kLoad: a block to load from an external store)
  std::vector<int64_t> load_index;  // first Allocate: per load, its table index (-1: state)
  std::vector<int32_t> fresh;       // blocks from BlockPool::Allocate
  std::vector<int32_t> to_release;  // per pool batch
  std::vector<int32_t> release_low, release_normal;
  std::vector<int64_t> positions;
  std::vector<std::pair<int64_t, int32_t>> release_order;  // (block end position, block)
  std::vector<int64_t> full_prefix;
  // Lookup visits token groups before state groups: attention bounds the hit cheaply, and the
  // state group's downward probe then starts from there instead of from the prompt's end.
  std::vector<size_t> search_order;  // Lookup: consecutive cached blocks per group, -1 unknown
};

}  // namespace hkv
