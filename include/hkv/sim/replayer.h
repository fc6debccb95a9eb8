// Replayer: a trace replayed through the real KvCacheManager by the synchronous first-come
// first-served continuous-batching scheduler of replay.md, so that hybridkv's figures compare
// number for number with any other manager replayed by the same rules.
//
// Contract: Replay follows ../shared/design/replay.md step by step — arrivals join the waiting
// tail in file order (idle gaps are skipped, not counted); running requests first, each
// allocating min(remaining, budget, max_model_len - 1 - computed) slots and preempting the last
// running request on failure (freed, computed reset, pushed to the front of waiting; when the
// victim is the request itself the running loop stops); then, only in a step without preemption,
// waiting requests are admitted while budget and the running cap allow, each with its prefix hit
// (block aligned, at most num_tokens - 1), and only if its whole remaining prompt fits (the
// manager reserves the part beyond this step's chunk as lookahead); then every scheduled request
// commits, and those that computed all their tokens append their next output token, finishing
// (and freeing) at output_len. Outputs come from the trace, or from a generator seeded by
// `output_seed` when the trace has none. The manager is used through its public API only; the
// time spent inside its calls (and in building each scheduled request's block tables, as an
// engine would) is measured per step. Given the same trace, config and options, every figure but
// the timings is the same on every run.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/manager/manager_config.h>
#include <hkv/sim/trace.h>
#include <hkv/vllm/kv_cache_config.h>
#include <hkv/vllm/kv_cache_manager.h>

namespace hkv {

struct ReplayOptions {
  int64_t token_budget = 8192;
  int32_t max_running = 1024;
  int64_t max_model_len = 16384;
  uint64_t output_seed = 0;  // outputs of requests the trace gives none
  int32_t vocab = 32000;     // range of generated output tokens
  bool record_steps = false;
  bool record_requests = false;  // fill ReplayReport::requests
  // vLLM replay only: scheduler_reserve_full_isl, the admission gate that requires the whole
  // prompt to fit (vLLM's default, on).
  bool reserve_full_prompt = true;
  // vLLM replay only: vLLM's own eviction order, or hybridkv's within vLLM's layout.
  vllm::EvictionPolicy vllm_policy = vllm::EvictionPolicy::kVllm;
  bool check_invariants = false;  // run the manager's checker after every step (tests)
  // hkv replays with two-level memory: compact between steps when CompactionDue says so, as the
  // reference engine does (its page copies are counted in ReplayReport::pages_moved).
  bool compact = true;
  // hkv replays: the manager publishes a step's blocks when it is allocated
  // (ManagerConfig::publish_at_allocate), as the engine this loop models - one forward pass over
  // the step's requests, vLLM's - allows: a request admitted in a step hits the blocks an earlier
  // one computes in it, as vLLM's own manager does. false: at Commit.
  bool publish_at_allocate = true;
  // hkv replays: the `oracle` mode — every pool evicts by the trace's future (FutureUse, Belady's
  // rule) instead of by recency; the config's own eviction_rank must be unset.
  bool oracle = false;
  // Called with the number of finished requests every 256 steps and once at the end (a progress
  // bar); outside the measured manager time.
  std::function<void(int64_t finished)> on_progress;
};

// One replayed step, as the per-step log records it (after admissions, before finishing).
struct ReplayStep {
  int64_t step = 0;  // the step counter s (idle gaps skipped)
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t blocks_used = 0;    // held blocks over all pools (cached-but-free count as free)
  int64_t cached_blocks = 0;  // blocks with a prefix identity, held or free
  int64_t hit_tokens = 0;     // prefix-hit tokens of this step's admissions
  int64_t preemptions = 0;
  int64_t scheduled_tokens = 0;
  int64_t state_splits = 0;  // recurrent checkpoints inside the step's chunks (pieces - 1)
};

// One request's course through a replay, as vLLM's reference script logs it (requests.csv):
// steps are the step counter s (idle gaps skipped, not counted).
struct RequestRecord {
  int64_t id = 0;
  int64_t arrival_step = 0;
  int64_t first_scheduled_step = -1;
  int64_t first_hit_tokens = -1;  // prefix-hit tokens at the first admission
  int64_t preemptions = 0;
  int64_t finish_step = -1;
  bool operator==(const RequestRecord&) const = default;
};

// Mean and nearest-rank percentiles of the per-step manager time, in microseconds.
struct StepTimes {
  double mean = 0, p50 = 0, p99 = 0;
};

struct ReplayReport {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t scheduled_tokens = 0;
  int64_t first_admission_tokens = 0, first_admission_hits = 0;  // each request's first admission
  int64_t admission_tokens = 0, admission_hits = 0;              // every admission
  int64_t peak_blocks_used = 0;
  int64_t peak_running = 0;
  int64_t num_blocks = 0;  // over all pools, null blocks excluded
  // Chunk splits for recurrent checkpoints: in all, in the busiest step, and for one request in
  // one step (never above the manager's max_state_splits). vLLM's are 0: its `align` mode
  // schedules chunks that end at block boundaries, and in `all` mode the SSD kernel leaves the
  // states at its own chunk boundaries.
  int64_t state_splits = 0, max_step_state_splits = 0, max_request_state_splits = 0;
  // Two-level memory (ReplayOptions::compact): compactions, the pages they moved (each a copy of
  // one page of its class for the engine), the slabs they gave back, and of the pages moved the
  // free ones moved for what they cache.
  int64_t compactions = 0, pages_moved = 0, slabs_compacted = 0, cached_pages_moved = 0;
  std::vector<double> manager_us;       // per step
  std::vector<ReplayStep> log;          // when record_steps
  std::vector<RequestRecord> requests;  // when record_requests, in trace order
  // vLLM replay: the reference script's digest of the block ids handed to the model runner
  // (per scheduled request in order: its id, then per group the ids - all of an admitted
  // request's, the new ones of a running request's), so equal digests mean equal block ids.
  uint64_t block_id_digest = 0;
  // hkv replays: the manager's counters at the end (KvCacheManager::stats), so a figure can be
  // traced to the rule behind it (give-backs, demotions, refused allocations).
  ManagerStats manager_stats{};

  double hit_rate() const;
  double hit_rate_incl_readmissions() const;
  double state_splits_per_step() const;
  StepTimes manager_times() const;
};

// Errors (nothing is replayed): options out of range, a manager that allows fewer tokens than
// max_model_len, and a request with an empty or too long prompt, an output that disagrees with
// output_len, or an arrival before the previous request's. ResourceExhausted when a request
// cannot be admitted even with nothing running (the pools are too small for it).
Result<ReplayReport> Replay(const Trace& trace, const ManagerConfig& config,
                            const ReplayOptions& options);

// The same trace replayed through vllm::KvCacheManager (vLLM v1's manager restated) by the
// scheduler of vLLM's reference script (../shared/vllm_reference): replay.md's rules with
// vLLM's own where they differ — the Mamba `align` chunk split at block boundaries, the
// full-prompt admission gate counted by vLLM's get_num_blocks_to_allocate (sliding windows
// capped at their admission limit), a running loop that stops when the budget is spent, blocks
// cached as they are allocated, and a request that reaches max_model_len finishing there.
// Peak blocks are blocks in use after the step's scheduling (the null block excluded).
// options.max_model_len and token_budget must equal the config's.
Result<ReplayReport> ReplayVllm(const Trace& trace, const vllm::KvCacheConfig& config,
                                const ReplayOptions& options);

// Hit rate of the trace with an infinite cache of `block_tokens`-token blocks: at each arrival,
// the block-aligned prefix (at most prompt - 1 tokens) that earlier requests cover with the
// tokens they computed (prompt and outputs but the last, which is sampled and never computed),
// over all prompt tokens.
double IdealHitRate(const Trace& trace, int32_t block_tokens);

}  // namespace hkv
