// Verify: the end-to-end proof. A randomised workload runs through the Engine on a scaled-down
// model and every finished sequence is compared with the dense reference.
//
// Contract: RunVerify scales `real` (ScaleModel), plans it for `memory_bytes` (small, so that
// requests compete and get preempted), and submits `requests` requests drawn from `seed`: prompts
// that start with one of a few shared system prompts (and, on cross-attention models, carry one
// of a few images), multi-turn continuations of finished conversations, varied lengths, some
// sampled in parallel (forked), the greedy ones decoded speculatively with lookahead slots, a
// quarter with low retention; every third seed drops the last hit block (EAGLE-style). Freed
// blocks without identity are NaN-poisoned, two-level memory is compacted between steps (unless
// `compact` is off: moved pages are copied and their old places poisoned), and the manager's
// invariants are checked after every step. It runs at most `max_steps` scheduler steps and reports
// what happened; a mismatch is any logit beyond 1e-4 or any token the dense model would not have
// chosen. With sparse-KV policies the reference is the dense model masked to what each layer kept
// (MaskedLogits).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <hkv/common/result.h>
#include <hkv/connector/model_identity.h>
#include <hkv/engine/engine.h>
#include <hkv/pool/eviction_rank.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

struct VerifyOptions {
  int32_t requests = 24;
  uint64_t seed = 1;
  // The tiny model's weights; 0: derived from `seed`. Two runs with one seed and different weight
  // seeds serve the same prompts with models of identical geometry - a base and its fine-tune.
  uint64_t weights_seed = 0;
  int64_t max_steps = 5000;
  int64_t memory_bytes = 0;  // 0: about three of the workload's longest sequences
  int32_t block_tokens = 4;
  bool compact = true;  // the engine compacts stranded two-level memory (EngineOptions::compact)
  // Each step runs as one batch (EngineOptions::batched) and the manager publishes what a step
  // completes when it is allocated (ManagerConfig::publish_at_allocate): requests admitted in
  // one step hit the blocks an earlier one computes in it.
  bool batched = false;
  bool prompt_checkpoints = true;  // ManagerConfig::prompt_checkpoints
  // ManagerConfig::rolling_stride_after_give_back, rounded up to the scaled model's alignment.
  int64_t rolling_stride_after_give_back = 0;
  double branch_bonus = 0;  // ManagerConfig::branch_bonus: shared prefixes kept longer
  // ManagerConfig::thrash_guard and thrash_keep_share (0: learned).
  bool thrash_guard = false;
  double thrash_keep_share = 0;
  int32_t admission_headroom_steps = 0;  // ManagerConfig::admission_headroom_steps
  // ManagerConfig::eviction_rank: evict by this order instead of recency (nullptr: recency).
  std::shared_ptr<const EvictionRank> eviction_rank;
  // Sparse-KV policies on every full-attention layer (no speculative drafts then). Every
  // sequence is checked against the masked reference (MaskedLogits over what its layers kept);
  // dense_mismatches counts differences from the dense one, zero when the budget kept all.
  std::optional<SparseKvOptions> sparse;
  // Offload: the engine exports what it publishes into these tiers and loads hits from them
  // (EngineOptions::offload); the small memory evicts blocks that later requests then reload.
  // With `restarts` > 0 the workload is served in restarts + 1 parts, each by a fresh engine
  // (empty local cache, same weights and tiers) once the previous one drained - what a restarted
  // engine, or a second one sharing the tiers, sees.
  std::optional<OffloadOptions> offload;
  int32_t restarts = 0;
  // Called after every scheduler step with the index of the engine serving it (0 .. restarts)
  // and that engine's counters: fault tests use it to break a tier mid-run.
  std::function<void(int32_t engine, const EngineCounters& counters)> after_step;
  // KV events: a publisher bound with these options (groups from the scaled model's plan)
  // publishes every manager event of the run; first it waits up to kv_events_wait_ms for a
  // subscriber, so that one started alongside misses nothing.
  std::optional<KvEventPublisherOptions> kv_events;
  int kv_events_wait_ms = 0;
};

struct VerifyReport {
  std::string model;
  int64_t requests = 0;  // sequences finished and checked (forked siblings included)
  int64_t steps = 0;
  int64_t memory_bytes = 0;  // the KV budget the run planned with (the default's, when 0 was given)
  int64_t mismatches = 0;
  float max_logit_diff = 0.0f;
  int64_t dense_mismatches = 0;  // against the dense reference (== mismatches without policies)
  EngineCounters features;
  int64_t slabs_reclaimed = 0;  // two-level plans: slabs that moved from one class to another
  bool two_level = false;       // the plan draws its pages from shared slabs
  // Recurrent models: the attention block vLLM's one-page-size (padded) allocator would need for
  // this scaled model in the same budget; a recurrent hit shorter than it exists only here.
  int32_t padded_block_tokens = 0;
  bool completed = false;  // every request finished within max_steps
  // Offload, summed over the engines (`features` is the last engine's): hits that loaded blocks
  // from the tiers, loads that completed, loads that failed (and recomputed).
  int64_t external_hits = 0;
  int64_t loads_completed = 0;
  int64_t loads_failed = 0;
  int32_t engines = 1;
  int64_t kv_event_batches = 0;  // batches published (VerifyOptions::kv_events)
};

Result<VerifyReport> RunVerify(const ModelSpec& real, const VerifyOptions& options);

// The seed of the tiny model's weights a run uses.
uint64_t VerifyWeightsSeed(const VerifyOptions& options);
// The identity of the model a run serves, its weights named by their seed: what the tiers a run
// shares must be opened with, so that runs with other weights never load its entries.
Result<ModelIdentity> VerifyModelIdentity(const ModelSpec& real, const VerifyOptions& options);

}  // namespace hkv
