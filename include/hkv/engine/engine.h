// Engine: a continuous-batching scheduler that runs a tiny model through the KvCacheManager and
// the paged cache, recording every logit it computes so that a caller can compare generation
// with the dense reference.
//
// Contract:
// - Submit queues a request; Step runs one scheduler step: running requests decode first (one
//   token, or one plus `draft_tokens` speculative drafts verified in the same step), then
//   waiting requests prefill in chunks of at most `chunk` tokens, within `token_budget` tokens.
// - A step that cannot get blocks preempts the most recently admitted request after it (freed,
//   requeued with all its known tokens, recomputed later: prefix hits usually bring most back),
//   or yields itself when it is the newest; the oldest request always progresses.
// - Parallel sampling: a request with num_samples > 1 forks its siblings once its prompt is
//   computed; each then samples with its own seeded generator.
// - Speculative decoding: a deterministic draft rule proposes tokens, the target verifies them
//   greedily; rejected drafts are dropped by committing short or by Commit + Truncate
//   (alternately), so both paths run.
// - Every position the engine computes and keeps has its logits in Sequence::logits; with the
//   sampling draws in Sequence::draws the dense reference can replay every choice.
// - Compaction (EngineOptions::compact, two-level plans): at the start of a step, when no step is
//   open, the engine calls KvCacheManager::Compact and copies every moved page before anything
//   reads the cache: when some class strands at least one slab's worth of pages, or after an
//   allocation was refused while some class's free pages in slabs that hold its pages (cached
//   or not) would fill a slab.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/connector/block_memory_view.h>
#include <hkv/connector/kv_events.h>
#include <hkv/connector/tier_connector.h>
#include <hkv/engine/masked_reference.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>
#include <hkv/policy/policies.h>

namespace hkv {

// Sparse KV: one policy per sequence and cache-owning layer of a full-attention group (full
// attention and MLA; sliding windows, chunks and recurrent layers bound their memory already).
// After every step the engine feeds each policy the attention weights it asked for (computed by
// the same pass that produced the step's output), asks it which tokens to keep under the budget
// (resolved against the sequence's computed length), and when a group's layers keep fewer slots
// than they hold, calls KvCacheManager::Evict and moves the kept rows so whole blocks return to
// the pool. Long prompts are processed in chunks of EngineOptions::chunk: the first fills the
// cache, later ones evict by the policy. Every layer of a group keeps the same number of slots
// (one table serves them), each its own tokens. A request that is preempted starts over with
// fresh policies (what a prefix hit brings back is kept whole). An eviction that needs private
// blocks the pools cannot supply is deferred to the next step (counted), never forced.
struct SparseKvOptions {
  PolicyConfig policy;
  PolicyBudget budget;
  // Keep what every sparse layer held before every step in Sequence::sparse_steps, so that
  // MaskedLogits can replay the run (tests, verification).
  bool record_steps = false;
};

// Offload (hkv/connector): every block the manager publishes is exported into the tiers as it is
// published, and a request that misses locally is looked up in them too (KvCacheManager::Lookup
// with the engine's TierConnector). Its hit blocks load in the background while the other
// requests run; the request's first step runs once they are in. A failed load (a miss, damaged
// data, a dead server) restarts the request from a local lookup: it recomputes, and that request
// no longer consults the tiers.
struct OffloadOptions {
  std::vector<Tier*> tiers;  // lookup order, fastest first; not owned: they outlive the engine
  bool store = true;         // export published blocks into the tiers
  bool load = true;          // consult the tiers after a local miss
};

struct EngineOptions {
  int64_t token_budget = 64;
  int64_t chunk = 16;
  int32_t draft_tokens = 0;  // speculative drafts per decode step; 0: none
  // Slots reserved past each step (Allocate's lookahead), as engines that schedule the next
  // step's drafts ahead do; never read, so poisoning shows any use of them.
  int64_t lookahead = 0;
  // Fill blocks with NaN as they become free without a prefix identity, so that any read the
  // manager did not sanction changes the output (PagedKvCache::PoisonFreeBlocks).
  bool poison_free_blocks = false;
  // Two-level plans: compact stranded memory between steps (see the contract above).
  bool compact = false;
  // Each step as one batch, the way an engine with one forward pass over all its requests runs
  // it: every scheduled request is allocated first (in order, looked up right before), then
  // every step runs, in the same order, and commits. A step's KV is written before any later
  // step of the batch reads it, so with ManagerConfig::publish_at_allocate a request admitted
  // after another in the same step hits the blocks that one computes in it. A step's copies
  // (copy-on-write) are made when it is allocated, before a later allocation can reuse their
  // sources; tier stores (offload) wait until the batch has run. false: each request is
  // allocated, run and committed before the next is looked up.
  bool batched = false;
  // Sparse-KV policies (above); none: every token is kept. Not with draft tokens (a request that
  // evicted cannot be truncated).
  std::optional<SparseKvOptions> sparse;
  std::optional<OffloadOptions> offload;
  // KV events: every manager event, published as it happens (one batch per manager call that
  // produced any), with the tokens of the request that stored each block. Not owned.
  KvEventPublisher* kv_events = nullptr;
};

struct GenerationRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 8;
  int32_t num_samples = 1;  // > 1: fork siblings with ids id + 1 ... after the prompt
  bool greedy = true;       // else seeded sampling from the softmax
  uint64_t seed = 0;
  EncoderInput encoder;  // cross-attention models: the request's image
  Retention retention = Retention::kNormal;
};

struct Sequence {
  RequestId id = 0;
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  std::map<int64_t, std::vector<float>> logits;  // per computed position
  std::map<int64_t, double> draws;  // uniform draw that chose the token at each sampled position
  bool greedy = true;
  EncoderInput encoder;
  Retention retention = Retention::kNormal;
  // With SparseKvOptions::record_steps, one run per time the request started (again, after a
  // preemption): its steps from position 0 on, each with what the sparse layers held before it (a
  // prefix hit appears as one dense step), the logits it computed, and how many tokens were known
  // when it started (later tokens up to the next run's start were sampled from its logits). A
  // recomputation evicts differently from the first computation, so each run is checked against
  // its own masks.
  struct SparseRun {
    std::vector<SparseStepRecord> steps;
    std::map<int64_t, std::vector<float>> logits;
    int64_t tokens_before = 0;
  };
  std::vector<SparseRun> sparse_runs;
};

struct EngineCounters {
  int64_t steps = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t forks = 0;
  int64_t truncations = 0;
  int64_t checkpoint_hits = 0;  // hits on a model with recurrent state (they land on checkpoints)
  int64_t shortest_checkpoint_hit = 0;  // fewest tokens one of those hits reused (0: none)
  int64_t window_blocks_freed = 0;
  // Recurrent checkpoints inside a step's chunk: the step ran in pieces split there (what a
  // chunked SSD / DeltaNet kernel needs to leave those states). Total, and the most one request
  // had in one step (the manager caps it at ManagerConfig::max_state_splits).
  int64_t state_splits = 0;
  int64_t max_state_splits = 0;
  int64_t branch_blocks_given_back = 0;      // the manager's (ManagerStats), as of the last step
  int64_t rolling_states_given_back = 0;     // likewise
  int64_t remembered_branches_kept = 0;      // likewise
  int64_t shared_prefixes_marked = 0;        // likewise
  int64_t thrash_probation_frees = 0;        // likewise
  int64_t keys_taken_over = 0;               // likewise
  int64_t admissions_held_for_headroom = 0;  // likewise
  // Likewise: the manager's checkpoint-coverage demotions of all three kinds (ManagerStats).
  int64_t coverage_demotions = 0;
  int64_t cross_attention_reuses = 0;  // requests that started on cached encoder K/V
  int64_t drafts_accepted = 0, drafts_rejected = 0;
  int64_t compactions = 0;      // Compact calls that returned slabs to the shared memory
  int64_t pages_moved = 0;      // pages those compactions moved (and the engine copied)
  int64_t slabs_compacted = 0;  // slabs they returned
  // Those of them made for a class of recurrent states (KvCacheManager::CompactFor): the emptied
  // slabs went to the states instead of the shared memory.
  int64_t compactions_for_states = 0;
  // Those made for another class, mostly caching, that would evict (token pages; the emptied
  // slabs went to it), and the free cached pages compactions made for one class moved, so that
  // their slabs could be emptied without dropping younger cache (ArenaUsage::cached_pages_moved).
  int64_t compactions_for_cache = 0;
  int64_t cached_pages_moved = 0;
  // Sparse KV: Evict calls, the slots they dropped (summed over groups), the blocks they took
  // out of requests' tables (returned to the pool unless a forked sibling still holds them),
  // and evictions deferred for want of private blocks.
  int64_t evictions = 0;
  int64_t tokens_evicted = 0;
  int64_t blocks_evicted = 0;
  int64_t evictions_deferred = 0;
  // Offload: hits that needed blocks from the tiers (and their tokens), loads that completed and
  // that failed (the request recomputed), and steps that waited for a load with nothing else to
  // run.
  int64_t external_hits = 0;
  int64_t external_hit_tokens = 0;
  int64_t loads_completed = 0;
  int64_t loads_failed = 0;
  int64_t load_waits = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const ModelSpec& spec, const ModelWeights& weights,
                                                const Plan& plan, const ManagerConfig& config,
                                                const EngineOptions& options);
  // Movable; a moved-from engine may only be destroyed or assigned to.
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  Status Submit(const GenerationRequest& request);
  // One scheduler step. Fails only on an internal error (a manager refusal that the scheduler
  // did not expect, or a paged-cache addressing failure).
  Status Step();
  bool idle() const;

  // Sequences that finished, in finishing order; their requests are freed.
  const std::vector<Sequence>& finished() const;
  const EngineCounters& counters() const;
  const KvCacheManager& manager() const;
  // With EngineOptions::offload: the connector (its stats), and the memory view it moves blocks
  // through; null otherwise.
  const TierConnector* connector() const;
  const BlockMemoryView* memory_view() const;

 private:
  struct Impl;  // src/engine/engine_impl.h
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Compares a finished sequence with the dense reference: logits of every computed position
// within `tolerance`, and every generated token the choice the dense logits give (greedy, or the
// same uniform draw). Returns the largest logit difference; counts mismatches.
struct DenseCheck {
  float max_logit_diff = 0.0f;
  int64_t mismatches = 0;
};
DenseCheck CheckAgainstDense(const ModelSpec& spec, const ModelWeights& weights,
                             const Sequence& seq, float tolerance = 1e-4f);
// The same against MaskedLogits over the sequence's recorded sparse steps (a run with
// SparseKvOptions::record_steps).
DenseCheck CheckAgainstMasked(const ModelSpec& spec, const ModelWeights& weights,
                              const Sequence& seq, float tolerance = 1e-4f);

}  // namespace hkv
