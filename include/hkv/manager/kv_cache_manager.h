// KvCacheManager: the one object an engine drives to place a hybrid model's KV cache and
// recurrent state, share prefixes between requests, and roll requests back.
//
// Contract:
// - A request is added with its prompt, looked up in the prefix cache, then advanced step by
//   step: Allocate reserves the slots of the step's tokens (all groups or none), the engine runs
//   the step using BlockTable / SlotMapping / State / Step, then Commit records how far it got.
//   Output tokens become known with AppendTokens. Positions at or past the known tokens are
//   speculative: they may be computed, but are never published, and the recurrent state is
//   snapshotted after each of them so that Truncate can return to any of them exactly.
// - Every mutating call either succeeds or returns an error naming what was wrong and changes
//   nothing (CheckInvariants() holds after every call, and the pools are as before on error).
// - Lookup never mutates. A hit stays valid until the next mutating call; Allocate rechecks it.
// - Groups keep what their TokenRule needs: full attention every block; sliding window and
//   chunked groups release blocks that can no longer be attended to (their table entries become
//   the null block); the encoder group holds the encoder's blocks for the request's life; a state
//   group holds one live state plus checkpoints.
// - Free releases tail blocks before head blocks; blocks without a prefix identity go to the head
//   of the free list (reused first), the rest to its tail (LRU across requests).
// - Steady state (request slots recycled, tables grown to their working size) allocates nothing
//   per token; events are the exception, and can be switched off.
// - Compaction (two-level memory only): Compact moves held pages out of sparsely held slabs into
//   free pages of the same class and returns the emptied slabs to the shared memory. Only between
//   steps (refused while any request has a step open). Every block id the manager hands out
//   afterwards - tables, state slots, hits - names the new page; the engine must copy each moved
//   page, all of its bytes for every layer of its class, from src to dst before its next step
//   reads the cache. Identities move with their pages (events: removed src, stored dst); pages
//   the emptied slabs still cached are evicted (removed).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/manager/external_blocks.h>
#include <hkv/manager/manager_config.h>
#include <hkv/manager/request.h>
#include <hkv/pool/arena_usage.h>
#include <hkv/pool/kv_event.h>

namespace hkv {

struct ManagerEvent {
  KvEvent::Kind kind = KvEvent::Kind::kStored;
  int32_t pool = 0;
  int32_t group = 0;  // unused for kCleared
  BlockHash hash;     // unused for kCleared
  int32_t block = 0;  // unused for kCleared
  // Stored events: the request that published the block and the decoder position its tokens
  // start at (a state checkpoint: the position it follows; the block then stands for the whole
  // prefix); 0 and -1 for encoder blocks and identities that moved with a compacted page.
  RequestId request = 0;
  int64_t position = -1;
  // Stored events of a request: the prefix digest before the block (the previous block of the
  // group's chain; a checkpoint's: `align` tokens earlier), none for a first block; and the
  // request's adapter (0: the base model).
  std::optional<BlockHash> parent = std::nullopt;
  uint64_t adapter = 0;
};

struct PoolUsage {
  int32_t num_blocks = 0;  // excluding the null block
  int32_t num_free = 0;    // free, cached or not
  int32_t num_cached = 0;  // blocks with a prefix identity, held or free
  // Two-level memory: free blocks in slabs that still hold blocks of this pool (what compaction
  // could give back), and those of them caching nothing (stranded). Without it: 0.
  int32_t num_free_in_held_slabs = 0;
  int32_t num_stranded = 0;
  int32_t num_free_cached = 0;  // free blocks with a prefix identity (dropped when reused)
  double usage() const;         // held / num_blocks
};

// What Compact did: the moves the engine must perform (pool = page class; copy the whole page
// src -> dst before the next step reads the cache) and the slabs returned to the shared memory.
using CompactionResult = CompactionPlan;

struct ManagerStats {
  int64_t lookups = 0;
  int64_t lookup_tokens = 0;  // prompt tokens offered to Lookup
  int64_t hit_tokens = 0;     // tokens Lookup found
  int64_t encoder_lookups = 0;
  int64_t encoder_hits = 0;
  int64_t allocations_failed = 0;  // Allocate calls refused for lack of blocks
  int64_t recomputed_tokens = 0;   // tokens Truncate asked engines to compute again
  // Window/chunk blocks kept at branch points that Allocate gave back to the cache so that an
  // allocation short of blocks could succeed (not counted when it was refused anyway).
  int64_t branch_blocks_given_back = 0;
  // Requests that kept their window blocks at a branch point only the manager's memory of
  // branches showed (ManagerConfig::branch_memory_entries): the prefix had been evicted.
  int64_t remembered_branches_kept = 0;
  // Times a cached token block gained a second or later continuation, so that the prefix up to
  // it was marked shared (ManagerConfig::branch_bonus; counted only with it on).
  int64_t shared_prefixes_marked = 0;
  // ManagerConfig::thrash_guard: the share of freed chains that now keep their place (1: all, as
  // with least recently freed first), requests whose prompt continued a chain end it remembered
  // (cached or not), and finished requests whose blocks went on probation.
  double thrash_keep_share = 1;
  int64_t thrash_returns_seen = 0;
  int64_t thrash_probation_frees = 0;
  // Blocks and checkpoints a request computed again while a free block still cached the same
  // prefix: the newer copy took the key over (BlockPool::Publish), the older one was freed of it.
  int64_t keys_taken_over = 0;
  // Admissions refused because they would leave less than ManagerConfig::admission_headroom_steps
  // of decode growth for the running requests, though their own need fitted (also counted in
  // allocations_failed).
  int64_t admissions_held_for_headroom = 0;
  // Rolling recurrent states (the newest aligned state a running request keeps, to publish when
  // it ends) that Allocate gave back for the same reason: published as cached checkpoints, or
  // dropped where the state was the request's live one (its step then writes in place).
  int64_t rolling_states_given_back = 0;
  // Checkpoint coverage (ManagerConfig::evict_uncovered): cached attention blocks demoted when
  // the last checkpoint covering them was evicted, cached checkpoints demoted when an attention
  // block before them was, and checkpoints a request's hit started from demoted when it ended
  // with a newer state on the same, unbranched path.
  int64_t uncovered_blocks_demoted = 0;
  int64_t unreachable_checkpoints_demoted = 0;
  int64_t superseded_hits_demoted = 0;
  // External stores (Lookup with ExternalBlocks, FinishLoad): hit tokens that needed at least one
  // external block, blocks loaded and published, loads that failed (their requests started over).
  int64_t external_hit_tokens = 0;
  int64_t blocks_loaded = 0;
  int64_t loads_failed = 0;
};

class KvCacheManager {
 public:
  static Result<KvCacheManager> Create(const ManagerConfig& config);
  KvCacheManager(KvCacheManager&&) noexcept;
  KvCacheManager& operator=(KvCacheManager&&) noexcept;
  ~KvCacheManager();

  // Registers a request and its prompt. Errors: duplicate id, empty prompt, prompt or encoder
  // beyond the configured maxima, items outside the prompt, encoder tokens on a model without
  // cross attention (or none on one with it).
  Status AddRequest(const RequestSpec& spec);
  // The longest cached prefix usable by every group (fixed point over the groups, a multiple of
  // align_tokens, at most prompt - 1 tokens so the last token is computed), and whether the
  // encoder's blocks are cached. Only before the request's first Allocate.
  Result<PrefixHit> Lookup(RequestId id);
  // The same, counting a block as cached when it is in the pools or `external` has it: the hit
  // is the longest prefix every group can continue from with blocks from either place, and
  // hit.loads says how many of them must be loaded. The first Allocate with such a hit acquires
  // the local blocks, gives every external one a fresh block (all-or-nothing with the rest of the
  // step; the hit went stale if more blocks are missing locally than it planned to load) and lists
  // them in StepInfo::loads. The engine fills them - asynchronously if it likes, running other
  // requests meanwhile - and then calls FinishLoad before it runs the step. The blocks are
  // published only then.
  Result<PrefixHit> Lookup(RequestId id, const ExternalBlocks& external);
  // Ends the loads of the request's first step. loaded: the blocks hold the external copies and
  // are published; the step continues (run it, then Commit). Not loaded (a tier failed, data was
  // corrupt): every block the request holds is released - the load targets without an identity,
  // so nobody ever reads them - and the request is as it was after AddRequest: look it up again
  // (without the failing store) and allocate; it recomputes what the load would have brought.
  // kFailedPrecondition when the request has no loads pending. The caller must have stopped
  // writing the blocks (a Free while loading releases them the same way).
  Status FinishLoad(RequestId id, bool loaded);
  // Reserves slots for positions [computed, computed + num_new_tokens + lookahead) in every group
  // and opens a step over [computed, computed + num_new_tokens). The first call takes the hit
  // from Lookup (or {} for none) and sets computed = hit.tokens. Fails with kResourceExhausted
  // (nothing changed) when a pool lacks blocks; with kFailedPrecondition when the hit went stale,
  // when a step is already open, or when a hit is passed after the first call. Short of blocks,
  // it first gives back what live requests hold only as cache - window blocks kept at branch
  // points, rolling recurrent states (ManagerStats) - one request at a time, and refuses only
  // when even all of that does not suffice. A first call while other requests have started
  // must also leave ManagerConfig::admission_headroom_steps of their decode growth free.
  Status Allocate(RequestId id, int64_t num_new_tokens, const PrefixHit& hit = {},
                  int64_t lookahead = 0);
  // Closes the open step: positions [0, computed) hold valid KV and state, for some computed in
  // [step begin, step end]. Publishes full blocks of known tokens and recurrent checkpoints,
  // and releases blocks that left a window or chunk. With recurrent groups a state must exist at
  // `computed`: the step's end, a position StateStep::snapshots lists (speculative ones), or the
  // step's begin when the step did not write its state in place (kInvalidArgument otherwise).
  Status Commit(RequestId id, int64_t computed);
  // Appends sampled (or accepted) tokens to the request's known tokens.
  Status AppendTokens(RequestId id, std::span<const int32_t> tokens);
  // A new request sharing everything `parent` has: blocks are shared and copied on the next
  // write (the copy is reported by Step), and so is the recurrent state. Not while the parent
  // has an open step.
  Status Fork(RequestId parent, RequestId child);
  // Keeps positions [0, n) and drops the rest, in every group. The recurrent state rolls back to
  // the newest state at or before n that still exists (the live state, a snapshot the request
  // holds, or a cached checkpoint), and windows get back blocks they had released (from the
  // cache) or roll back too; the result says how many tokens must be computed again. Refused
  // while a step is open and for n beyond max(known tokens, computed positions).
  Result<TruncateResult> Truncate(RequestId id, int64_t n);
  // Sparse KV: a policy keeps `keep` of the `n` slots that full-attention group `group` holds
  // for the request's computed positions (n = computed minus tokens evicted before), and the
  // first `unchanged` of them are the current first slots, in place. Afterwards the group's
  // table indexes slots: the kept tokens are slots [0, keep), the request's next positions
  // follow from slot keep on, and whole blocks past them return to the pool. Blocks holding
  // only unchanged slots stay; a block the engine must write that is shared or published is
  // replaced by a private one (the others keep being shared, and cached blocks stay hittable).
  // The engine copies each kept token from its old place to its slot, in slot order, for every
  // layer of the group, before its next call that allocates or compacts: blocks released here
  // keep their bytes until then. From the request's computed position on nothing it computes is
  // published in any group (its KV now depends on what was evicted), and Truncate is refused.
  // Errors (nothing changed): unknown request, open step, a group that is not full attention, keep
  // > n or unchanged > keep, or a pool out of blocks for the replacements.
  Result<EvictResult> Evict(RequestId id, int32_t group, int64_t keep, int64_t unchanged);
  // Ends a request and releases everything it holds (an open step is abandoned). `reason`
  // matters only with ManagerConfig::thrash_guard: a preempted request's blocks keep their place.
  Status Free(RequestId id, FreeReason reason = FreeReason::kFinished);
  // Drops every prefix identity. Only when no request holds blocks (kFailedPrecondition else).
  Status ResetPrefixCache();
  // With ManagerConfig::eviction_rank: the ranks of the prefixes ending in these digests changed,
  // so their free cached blocks, in every group, are requeued by their new rank. Held blocks
  // are queued by rank when they are freed. kFailedPrecondition (nothing changed) without a rank.
  Status Rerank(std::span<const BlockHash> digests);
  // Two-level memory: empties up to max_slabs_per_class (>= 1) slabs of every page class whose
  // held pages fit in the free pages of the class's other partly held slabs (SlabArena's
  // PlanCompaction), rewrites every reference to a moved page and returns the emptied slabs to
  // the shared memory. With a limit at least the class's slab count, each class is left with
  // fewer than one slab's worth of free pages in slabs that hold its pages. kFailedPrecondition
  // (nothing changed) while any request has an open step; an empty result without two-level
  // memory or when no slab can be emptied.
  Result<CompactionResult> Compact(int64_t max_slabs_per_class);
  // The same with a limit per class (one per pool, each >= 0; 0 leaves the class alone): an
  // engine compacts only the classes that strand memory, so the others keep their cached pages.
  Result<CompactionResult> Compact(std::span<const int64_t> max_slabs_per_class);
  // Compaction on behalf of class `pool` when its next page would evict one of its cached pages
  // (its free pages all cache something, and the first in eviction order was freed at tick T):
  // the other classes' slabs are emptied only where every cached page the compaction drops — in
  // the emptied slabs and among the pages receiving the moves — was freed before T, and the
  // emptied slabs go to `pool` as free pages instead of back to the shared memory. So memory moves
  // to the class in the one age order eviction follows, though held pages of the other classes
  // sit in every slab; younger cached pages of the emptied slabs move with their held pages. For a
  // class of token pages (not recurrent states) the bound is stricter: only cache that has waited
  // kCacheAgeMargin times as long as its victim (freed before clock - margin * (clock - T); none
  // when that is not above 0) is dropped, so that near the balance of two classes' ages a slab does
  // not go back and forth between them. `pool`'s own limit is ignored. An empty result when `pool`
  // has an uncached free page, no free page, or its next victim is demoted (tick 0: nothing is
  // older); errors as Compact, and kInvalidArgument for a bad pool.
  Result<CompactionResult> CompactFor(int32_t pool, std::span<const int64_t> max_slabs_per_class);
  static constexpr uint64_t kCacheAgeMargin = 3;

  // Per-step views. They stay valid until the next mutating call.
  Result<StepInfo> Step(RequestId id) const;
  Result<std::span<const int32_t>> BlockTable(RequestId id, int32_t group) const;
  // Appends the slot (block * block_tokens + offset) of every position in [begin, end) of a token
  // group. Positions must be reserved and kept by the group (not released by a window).
  Status SlotMapping(RequestId id, int32_t group, int64_t begin, int64_t end,
                     std::vector<int64_t>& out) const;
  // The same written into `out`, which must hold exactly end - begin slots (a caller's buffer,
  // e.g. a tensor the kernel reads; nothing is written on error).
  Status SlotMapping(RequestId id, int32_t group, int64_t begin, int64_t end,
                     std::span<int64_t> out) const;
  Result<StateStep> State(RequestId id, int32_t group) const;
  // Per-step delta of a token or encoder group's block table: the entries that changed since the
  // last TakeTableDelta for this request and group (all of them the first time). A decode step
  // usually changes none or appends one; Truncate, Evict, copy-on-write and Compact may change
  // earlier entries, which are then reported from the first one changed. Entries a window or
  // chunk released are not reported (nothing reads them again; they read as the old id or 0).
  // Marks the table taken, so the next call reports only later changes; the view stays valid
  // until the next mutating call. Errors: unknown request, group out of range, a state group.
  Result<TableDelta> TakeTableDelta(RequestId id, int32_t group);
  // Step, TakeTableDelta of every token and encoder group, State of every state group and the
  // SlotMapping of the step's positions in every decoder token group, in one call: what an engine
  // sends its kernels for the request this step, and only what changed in its tables. Errors
  // (nothing taken): unknown request, no open step.
  Status TakeStepInputs(RequestId id, StepInputs& out);

  // Request facts.
  bool Contains(RequestId id) const;
  Result<int64_t> NumTokens(RequestId id) const;  // known tokens
  // The tokens the request knows (prompt and appended), valid until the next call that changes
  // the request. What a stored event's blocks hold: KV events take their token ids from here.
  // With events recorded, a freed request's tokens stay until the TakeEvents after the next one
  // (Free publishes final states; the events naming them are taken after it).
  Result<std::span<const int32_t>> Tokens(RequestId id) const;
  Result<int64_t> NumComputed(RequestId id) const;  // positions with valid KV and state
  int32_t num_requests() const;

  const ManagerConfig& config() const;
  PoolUsage Usage(int32_t pool) const;
  // Two-level memory (config().arena): slabs per class, stranded pages, slabs moved and
  // compacted so far. num_slabs is 0 without it.
  ArenaUsage Arena() const;
  const ManagerStats& stats() const;
  std::vector<ManagerEvent> TakeEvents();

  // Reference counts equal holders, every block is free xor held, the prefix index agrees with
  // the blocks, every published block of a request carries the identity of that request's
  // tokens, tables match computed and reserved lengths; no requests means no held blocks.
  Status CheckInvariants() const;

 private:
  friend class ManagerProbe;  // manager_probe.h: read-only views for tests and debugging
  struct Impl;
  explicit KvCacheManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hkv
