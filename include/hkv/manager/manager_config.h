// ManagerConfig: what a KvCacheManager manages, in the manager's own terms.
//
// Contract: a config is a list of pools (block counts, block 0 of each being its null block) and
// a list of groups, each with the TokenRule that decides which token positions it keeps and the
// pool its blocks come from. Several groups may draw from one pool. FromPlan derives the config
// from a Plan (one pool per page class); tests and benchmarks may also build one by hand, for
// instance to give groups different block sizes. Validate() names the first field that is wrong.
//
// Decisions (docs/manager.md):
// - Prefix identities are chained at the gcd of the token groups' block sizes, and a prefix hit
//   is a multiple of their lcm (`align_tokens`), so every group's block boundaries line up with
//   it. A model without token groups uses `state_align_tokens` instead.
// - Recurrent checkpoints are taken at multiples of `checkpoint_interval` (0: none), at the last
//   aligned position before a prompt's end, at the last aligned position a request reached
//   (kept rolling), and after every speculative token of a step. Checkpoint positions are always
//   multiples of align_tokens except the speculative ones, which are private to their request.
// - Checkpoint retention: a checkpoint that can no longer be the best hit for the prefix it
//   covers is demoted (kept, still hittable, but first in the eviction order, so it never displaces
//   memory worth more). When a request ends, that is every checkpoint it published before its
//   final state, except where it diverged from a cached prefix (a branch point, which other
//   requests share); while it runs, interval checkpoints beyond its newest
//   `max_interval_checkpoints`.
// - A checkpoint strictly inside a step splits the step's chunk there: recurrent kernels
//   (Mamba-2 SSD, gated DeltaNet) leave a state only at the end of the chunk they are given, so
//   the engine runs the chunk in pieces. At most `max_state_splits` such checkpoints are planned
//   per request and step (0: none inside a chunk), kept in the order of their worth: the
//   divergence point, the prompt's end, the rolling state, then interval checkpoints newest
//   first. Speculative snapshots are not splits: a verification kernel keeps a state per draft.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/plan/plan.h>
#include <hkv/pool/eviction_rank.h>
#include <hkv/spec/token_rule.h>

namespace hkv {

struct GroupConfig {
  TokenRule rule;            // kAll, kWindow, kChunk, kEncoder or kState
  int32_t block_tokens = 0;  // tokens per block; 0 for a state group (one block = one state)
  int32_t pool = 0;          // index into ManagerConfig::pool_blocks

  bool is_state() const { return rule.kind == TokenRuleKind::kState; }
  bool is_encoder() const { return rule.kind == TokenRuleKind::kEncoder; }
};

// Two-level memory: the pools do not own fixed block ranges but draw their blocks from
// `num_slabs` shared slabs (large pages); a slab carved for pool p holds pages_per_slab[p]
// blocks, and returns to the shared slabs when all of them are free. Pool p's block ids are
// then 1 + slab * pages_per_slab[p] + page (so pool_blocks[p] must be
// num_slabs * pages_per_slab[p] + 1), which is what lets an engine address a block as
// slab * slab_bytes + page * page_bytes. num_slabs == 0: every pool owns all its blocks.
struct ArenaConfig {
  int64_t num_slabs = 0;
  std::vector<int32_t> pages_per_slab;  // per pool

  bool enabled() const { return num_slabs > 0; }
};

struct ManagerConfig {
  std::vector<int32_t> pool_blocks;  // blocks per pool, the null block included
  ArenaConfig arena;
  std::vector<GroupConfig> groups;
  int64_t max_model_len = 0;        // most decoder tokens (incl. lookahead) a request may reach
  int64_t max_encoder_tokens = 0;   // most encoder tokens a request may bring (cross attention)
  int32_t state_align_tokens = 16;  // hit granularity when no group keeps tokens
  int64_t checkpoint_interval = 0;  // recurrent checkpoints every this many tokens; 0: none
  bool demote_superseded_checkpoints = true;  // false: every checkpoint keeps its LRU place
  int32_t max_interval_checkpoints = 4;       // per request, not demoted while it runs; 0: all
  int32_t max_state_splits = 2;  // checkpoints inside one request's step (chunk splits)
  // Recurrent checkpoints at the prompt's last aligned position (what an identical prompt would
  // hit). false: checkpoints are admitted by expected reuse alone, as Marconi does - where
  // prefixes branch (the divergence checkpoint) and where a request ends (its final or rolling
  // state) - so a prompt seen again is computed once more and checkpointed then, at the branch
  // point it has become. A state costs as much as thousands of tokens of attention KV, and a
  // prompt-end checkpoint is demoted as soon as its request ends anyway.
  bool prompt_checkpoints = true;
  // Once a request gave its rolling recurrent state back under memory pressure (see Allocate), it
  // keeps its next ones only at multiples of this many tokens instead of at every aligned
  // position: otherwise the next aligned position, a block later, takes the second state page
  // back at once, and each running request goes on holding two states (live and rolling) when
  // memory is short. The state it ends with is then up to this many tokens older, so a next turn
  // hits up to that much less. 0: off (every aligned position); else a multiple of align_tokens().
  int64_t rolling_stride_after_give_back = 0;
  // An admission - a request's first Allocate while others have started - succeeds only if,
  // besides its own need, every pool can still supply what the started requests' decoder token
  // groups need for this many more decode steps (one token per request and step, rounded up to
  // blocks per group); what running requests keep as cache may be given back for it, as for any
  // step, and the admission allocates only its own blocks.
  // Under overload a request admitted into the last free blocks is soon preempted, or forces a
  // running one out, and computes its prefix again; a few steps of headroom keep the admission
  // waiting instead (vLLM's v0 block manager had a watermark of 1% of the blocks for the same
  // reason). 0: off (admit whatever fits, as vLLM v1 does).
  int32_t admission_headroom_steps = 0;
  bool enable_prefix_caching = true;
  bool drop_last_hit_block = false;  // speculative decoding (EAGLE/MTP): hits end one unit early
  // Free releases the token blocks of all groups sharing a pool in one tail-first order by
  // position, so a finished request's prefix is evicted coherently across groups (what a hit
  // needs) rather than one group at a time; and a request keeps the window/chunk blocks before
  // its branch point (where its prefix branches from another request's) until it ends. Window
  // blocks released mid-way keep their earlier place, except a short request's (at most three
  // spans) in a pool shared with full attention, which rejoin the order so that a tail evicted
  // from it leaves a shorter hit. false: vLLM's order (group by group, each tail first).
  bool coherent_eviction = true;
  // With coherent eviction and one pool (no two-level memory): how many branch points the
  // manager remembers after their blocks are evicted (the digest of each prefix where a request
  // kept its window for a branch). A request computing such a prefix again keeps the window
  // blocks a hit there needs, as if the branch were still cached, so the requests after it hit
  // the prefix instead of only the one after next; a request whose hit passes such a branch
  // holds its window blocks still cached. A direct-mapped table of this many 16-byte digests
  // (rounded up to a power of two); 0: off.
  int32_t branch_memory_entries = 1024;
  // Shared prefixes kept longer (docs/manager.md, "Shared prefixes kept longer"). The manager
  // counts the distinct blocks published after each cached token block; when a block gains its
  // second (third, ...) continuation, every block of the prefix up to it, in each group, and the
  // recurrent checkpoints at its end take that count as their share level. A freed block of level
  // L >= 2 is queued behind the blocks freed after it for branch_bonus * min(L - 1,
  // branch_bonus_levels) cache turnovers (one turnover: as many frees as the largest pool, or the
  // arena in its finest page class, has blocks). A system prompt many sessions branched from then
  // outlives the single-use tails of the conversations around it, and a conversation's own chain
  // (each turn extends the last, one continuation per block) keeps plain recency. 0: off (least
  // recently freed first); ignored with an eviction_rank.
  double branch_bonus = 0;
  int32_t branch_bonus_levels = 8;  // in [1, 254]
  // Keeping conversations when the cache cannot hold each until its next turn (docs/manager.md,
  // "Thrash guard"). The manager remembers the chain end of every finished request and, when a
  // later prompt continues one, how many eviction-clock ticks it took to come back, whether the
  // cache still held it or not. From that distribution and the cache's residence (its cached
  // blocks queued by recency) it picks the share p of finished requests whose blocks keep their
  // place; the others go on probation (evicted before every block freed normally, still serving
  // hits). A request whose hit reached the chain it continues is always kept. p = 1 (all kept:
  // least recently freed first) whenever recency serves best. Off by default; ignored with an
  // eviction_rank or without prefix caching.
  bool thrash_guard = false;
  // With thrash_guard: 0 learns the share; a value in (0, 1] fixes it instead (tests, or a
  // deployment that measured its own).
  double thrash_keep_share = 0;
  // Allocate publishes the full blocks of known tokens that the step it opens completes, instead
  // of Commit: a request looked up while that step is open - later in the same batch - hits
  // them, as in vLLM, which caches blocks when it schedules them. For an engine that runs every
  // step it opened as one batch, in which each layer writes the batch's KV before any of its
  // attention reads (vLLM's forward pass; the reference engine's batched mode). Their `stored`
  // events come at Allocate too, before the KV exists: a consumer that copies blocks on those
  // events (a tier) waits until the step has run. A step whose blocks another request hit cannot
  // be taken back: Commit short of them, or Free before Commit, is refused while that request
  // holds them. Models with recurrent groups, and first steps loading external blocks, publish
  // at Commit regardless (a hit there needs a state, which exists only once its step has run).
  bool publish_at_allocate = false;
  // A model with recurrent and full-attention groups: attention blocks that no cached checkpoint
  // at or after them covers, and checkpoints whose attention prefix was evicted, can serve no hit
  // (a hit needs both), so they are demoted - evicted before anything a hit can use - as soon as
  // that happens; and when a request ends with a newer state on the path its hit started from,
  // the checkpoint it started from is demoted unless prefixes branch there. false: each page
  // class keeps its own recency order, and only a request's own superseded checkpoints are
  // demoted.
  bool evict_uncovered = true;
  bool record_events = true;
  // Queue freed cached blocks by this rank instead of by recency (pool/eviction_rank.h), in
  // every pool; KvCacheManager::Rerank requeues blocks whose rank changed. Shared, not copied:
  // the caller may keep advancing it. nullptr: least recently freed first.
  std::shared_ptr<const EvictionRank> eviction_rank;

  // One pool per page class (its pages, capped to 2^31 - 1), one group per plan group.
  static Result<ManagerConfig> FromPlan(const Plan& plan);

  Status Validate() const;
  // Whether this config describes the memory `plan` lays out: one group per plan group with the
  // same rule, block size and page class; one pool per page class with no more blocks than the
  // class has pages; the same slabs. Where a config and a plan meet (an engine that sizes its
  // buffers from the plan and hands block ids from the config), a mismatch would index memory
  // that is not there; the first difference found is named.
  Status CheckMatches(const Plan& plan) const;

  // Derived values; meaningful once Validate() is OK.
  int32_t hash_tokens() const;   // gcd of token-group block sizes (or state_align_tokens)
  int32_t align_tokens() const;  // lcm of token-group block sizes (or state_align_tokens)
  // Whether pool `pool` holds recurrent states (a state group draws its pages from it).
  bool pool_holds_states(int32_t pool) const;
  // The smallest multiple of align_tokens() at or above `tokens` (>= 0), e.g. for a stride.
  int64_t AlignUp(int64_t tokens) const {
    const int64_t a = align_tokens();
    return (tokens + a - 1) / a * a;
  }
};

}  // namespace hkv
