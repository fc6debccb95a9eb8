// Engine::Impl: the reference engine's state and the scheduler's steps, behind Engine's public
// header (include/hkv/engine/engine.h) so that its contract is all that header shows. Private to
// the engine's sources: engine.cc (scheduling, execution, offload, compaction) and sparse_kv.cc
// (sparse-KV policies).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/common/splitmix64.h>
#include <hkv/connector/block_memory_view.h>
#include <hkv/connector/tier_connector.h>
#include <hkv/engine/engine.h>
#include <hkv/engine/paged_kv_cache.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/policy/kv_policy.h>

namespace hkv {

struct Engine::Impl {
  // A sparse layer's policy and the positions the layer holds, ascending. Copies clone the
  // policy: a forked sibling continues from its parent's decisions.
  struct SparseLayerState {
    std::unique_ptr<KvPolicy> policy;
    std::vector<int64_t> kept;
    int64_t shown = 0;  // leading slots whose rows the policy was given (WantsKeys)
    SparseLayerState() = default;
    SparseLayerState(const SparseLayerState& o)
        : policy(o.policy ? o.policy->Clone() : nullptr), kept(o.kept), shown(o.shown) {}
    SparseLayerState& operator=(const SparseLayerState& o) {
      policy = o.policy ? o.policy->Clone() : nullptr;
      kept = o.kept;
      shown = o.shown;
      return *this;
    }
    SparseLayerState(SparseLayerState&&) = default;
    SparseLayerState& operator=(SparseLayerState&&) = default;
  };
  struct Live {
    Sequence seq;
    std::vector<SparseLayerState> sparse;  // per Impl::sparse_layers_
    int32_t max_new_tokens = 0;
    int32_t num_samples = 1;
    SplitMix64 rng{0};
    bool prefilled = false;  // prompt computed (at least once; recompute after preemption
                             // doesn't fork again)
    bool forked = false;
    bool started = false;  // first Allocate done (Lookup no longer allowed)
    PrefixHit pending;     // the hit found at admission, for the first Allocate
    bool loading = false;  // the first step's hit blocks are loading from the tiers
    // The drafts of the step that is waiting for its loads (a restarted request's first step can
    // be a speculative decode step), verified when it runs.
    std::vector<int32_t> load_drafts;
    bool local_only = false;  // a load failed: look up without the tiers from now on
  };
  Impl(const ModelSpec& spec, const ModelWeights& weights, KvCacheManager manager,
       PagedKvCache cache, const EngineOptions& options);

  // Engine's public calls (engine.h).
  Status Submit(const GenerationRequest& request);
  Status Step();

  Status Admit(Live& r);
  // Step's parts: admission from the waiting queue, then one running request's step within the
  // step's token budget (`executed` counts the requests whose step ran).
  Status AdmitWaiting();
  Status StepRequest(Live* r, int64_t& budget, int64_t& executed);
  // Allocates one step of `r`, which has `computed` positions, over `n` new tokens (drafts
  // appended to `tokens` beyond the known ones when speculative), and starts the loads of a hit
  // on external blocks; the caller runs it (RunOrQueue). Returns false when blocks ran out and
  // someone was preempted.
  Result<bool> AllocateStep(Live& r, int64_t computed, int64_t n,
                            const std::vector<int32_t>& drafts);
  Status Preempt(const Live* victim);
  // The error for request `id`, refused blocks (`refusal`) with nothing left to preempt.
  Status DoesNotFitAlone(RequestId id, const Status& refusal) const;
  // Runs the open step of `r` (allocated by RunStep); the tokens it computed.
  Result<int64_t> Execute(Live& r, const std::vector<int32_t>& drafts);
  // Runs the open step of `r` and frees it if it is done; batched, queues it for RunBatch.
  Status RunOrQueue(Live* r, std::vector<int32_t> drafts);
  // EngineOptions::batched: runs the queued steps in their order, then stores what the batch
  // published into the tiers.
  Status RunBatch();
  // Execute's forward pass over the open step: the logits of its positions, vocab per row.
  Result<std::vector<float>> ForwardStep(Live& r, const StepInfo& step,
                                         const std::vector<int32_t>& drafts);
  // Execute's commit of positions up to `commit_at` of a step ending at `end`; every other
  // shortened step commits whole first and truncates, to exercise Truncate.
  Status CommitStep(RequestId id, int64_t end, int64_t commit_at);
  // Offload: ends `r`'s load (FinishLoad); whether the blocks arrived.
  Result<bool> EndLoad(Live& r, bool loaded);
  // Frees `r` if it generated everything it should.
  Status MaybeFinish(Live* r);
  Status FinishOrSample(Live& r, const std::vector<float>& last_logits, int64_t pos);
  int32_t Sample(Live& r, std::span<const float> logits, int64_t pos);
  int64_t WindowNulls(RequestId id) const;
  Status AfterManagerCall();
  // The tiers' stores and removals (TierConnector::TakeEvents), published under their media.
  Status PublishTierEvents(const RequestTokens& tokens);
  // The compaction policy, at the start of a step.
  Status MaybeCompact();
  // Sparse KV (sparse_kv.cc). StartSparse: fresh policies for a request starting over at `hit`.
  // PrepareSparse: the slots each sparse layer reads in the step [begin, end). FinishSparse: after
  // the step's Commit, feeds the policies and evicts what they drop.
  Status StartSparse(Live& r, int64_t hit);
  void PrepareSparse(Live& r, int64_t begin, int64_t end, PagedKvCache::StepView& view);
  // After the pass: the rows not yet shown to policies that rank by keys (WantsKeys).
  void ShowWritten(Live& r, PagedKvCache::StepView& view);
  Status FinishSparse(Live& r, int64_t begin, int64_t end);
  // FinishSparse's parts: the policies' selections, then per sparse group its eviction.
  void ObserveSparse(Live& r, int64_t begin, int64_t end);
  Status FinishSparseGroup(Live& r, int32_t g);
  Result<bool> EvictSparseGroup(RequestId id, int32_t g, int64_t keep, int64_t held,
                                int64_t unchanged);

  const ModelSpec& spec_;
  const ModelWeights& weights_;
  std::unique_ptr<KvCacheManager> manager_;
  PagedKvCache cache_;
  // Offload; declared after the cache so the connector's worker stops before the memory goes.
  std::unique_ptr<BlockMemoryView> view_;
  std::unique_ptr<TierConnector> connector_;
  std::vector<TierEvent> tier_events_;
  std::vector<ManagerEvent> scratch_events_;
  EngineOptions options_;
  std::deque<std::unique_ptr<Live>> waiting_;
  std::vector<std::unique_ptr<Live>> running_;
  std::vector<Sequence> finished_;
  EngineCounters counters_;
  // EngineOptions::batched: the steps allocated in this step, in order, with their drafts; the
  // manager events a tier stores once they have run.
  std::vector<std::pair<Live*, std::vector<int32_t>>> batch_;
  std::vector<ManagerEvent> store_after_batch_;
  bool has_state_ = false;
  int64_t truncate_toggle_ = 0;
  bool preempted_this_step_ = false;
  bool refused_since_compaction_ = false;  // an Allocate ran out of memory since the last step
  std::vector<int64_t> compact_limits_;    // MaybeCompact: slabs per class (0: not due)
  // Sparse KV: the layers policies run on (ModelSpec::layers index, manager group, KV heads of
  // the feedback), and per-step scratch, one entry per such layer.
  struct SparseLayer {
    int32_t layer = 0, group = 0, kv_heads = 0;
    int32_t key_width = 0, value_width = 0;  // floats per cached row (value 0: MLA)
  };
  std::vector<SparseLayer> sparse_layers_;
  std::vector<int32_t> sparse_groups_;
  std::vector<std::vector<int64_t>> step_positions_;
  std::vector<std::vector<float>> step_feedback_;
  std::vector<SlotView> step_views_;
  std::vector<std::vector<int32_t>> step_keep_;
  std::vector<int32_t> old_table_;
  std::vector<float> shown_keys_, shown_values_;
};

}  // namespace hkv
