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
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/common/splitmix64.h>
#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>

namespace hkv {

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
  int64_t branch_blocks_given_back = 0;  // the manager's (ManagerStats), as of the last step
  int64_t cross_attention_reuses = 0;    // requests that started on cached encoder K/V
  int64_t drafts_accepted = 0, drafts_rejected = 0;
  int64_t compactions = 0;      // Compact calls that returned slabs to the shared memory
  int64_t pages_moved = 0;      // pages those compactions moved (and the engine copied)
  int64_t slabs_compacted = 0;  // slabs they returned
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const ModelSpec& spec, const ModelWeights& weights,
                                                const Plan& plan, const ManagerConfig& config,
                                                const EngineOptions& options);

  Status Submit(const GenerationRequest& request);
  // One scheduler step. Fails only on an internal error (a manager refusal that the scheduler
  // did not expect, or a paged-cache addressing failure).
  Status Step();
  bool idle() const { return running_.empty() && waiting_.empty(); }

  // Sequences that finished, in finishing order; their requests are freed.
  const std::vector<Sequence>& finished() const { return finished_; }
  const EngineCounters& counters() const { return counters_; }
  const KvCacheManager& manager() const { return *manager_; }

 private:
  struct Live {
    Sequence seq;
    int32_t max_new_tokens = 0;
    int32_t num_samples = 1;
    SplitMix64 rng{0};
    bool prefilled = false;  // prompt computed (at least once; recompute after preemption
                             // doesn't fork again)
    bool forked = false;
    bool started = false;  // first Allocate done (Lookup no longer allowed)
    PrefixHit pending;     // the hit found at admission, for the first Allocate
  };
  Engine(const ModelSpec& spec, const ModelWeights& weights, KvCacheManager manager,
         PagedKvCache cache, const EngineOptions& options);

  Status Admit(Live& r);
  // Runs one step of `r`, which has `computed` positions, over `n` new tokens (drafts appended
  // to `tokens` beyond the known ones when speculative). Returns false when blocks ran out and
  // someone was preempted.
  Result<bool> RunStep(Live& r, int64_t computed, int64_t n, const std::vector<int32_t>& drafts);
  Status Preempt(const Live* victim);
  Status FinishOrSample(Live& r, const std::vector<float>& last_logits, int64_t pos);
  int32_t Sample(Live& r, std::span<const float> logits, int64_t pos);
  int64_t WindowNulls(RequestId id) const;
  Status AfterManagerCall();
  // The compaction policy, at the start of a step.
  Status MaybeCompact();

  const ModelSpec& spec_;
  const ModelWeights& weights_;
  std::unique_ptr<KvCacheManager> manager_;
  PagedKvCache cache_;
  EngineOptions options_;
  std::deque<std::unique_ptr<Live>> waiting_;
  std::vector<std::unique_ptr<Live>> running_;
  std::vector<Sequence> finished_;
  EngineCounters counters_;
  bool has_state_ = false;
  int64_t truncate_toggle_ = 0;
  bool preempted_this_step_ = false;
  bool refused_since_compaction_ = false;  // an Allocate ran out of memory since the last step
  std::vector<int64_t> compact_limits_;    // MaybeCompact: slabs per class (0: not due)
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

}  // namespace hkv
