#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <hkv/engine/engine.h>
#include <hkv/engine/transformer.h>
#include <hkv/manager/compaction_policy.h>
#include <hkv/pool/block_pool.h>

#include "../common/preempt_from_back.h"
#include "engine_impl.h"

namespace hkv {
namespace {

// The token whose softmax interval contains `u`.
int32_t PickByDraw(std::span<const float> logits, double u) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (float l : logits)
    total += std::exp(static_cast<double>(l - mx));
  double acc = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    acc += std::exp(static_cast<double>(logits[i] - mx)) / total;
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(logits.size() - 1);
}

// The draft rule (prompt-lookup style): the token that followed the latest earlier occurrence of
// the previous token, else a fixed function of it. Cheap and deterministic; greedy outputs of
// small random models repeat often enough that both acceptance and rejection happen.
int32_t Draft(const std::vector<int32_t>& tokens, int32_t vocab) {
  const int32_t previous = tokens.back();
  for (size_t i = tokens.size() - 1; i-- > 0;) {
    if (tokens[i] == previous) return tokens[i + 1];
  }
  return (previous * 7 + 3) % vocab;
}

// A recurrent checkpoint at a known position inside the step splits the chunk: the step runs in
// pieces ending there, as an engine with chunked recurrent kernels must (their states exist only
// at the ends of the chunks they are given). Speculative positions are not splits: a
// verification kernel keeps a state per draft. The piece boundaries, begin and end included.
Result<std::vector<int64_t>> StepCuts(const KvCacheManager& manager, RequestId id,
                                      const StepInfo& step, int64_t known) {
  std::vector<int64_t> cuts{step.begin};
  const std::vector<GroupConfig>& groups = manager.config().groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].is_state()) continue;
    HKV_ASSIGN_OR_RETURN(const StateStep st, manager.State(id, static_cast<int32_t>(g)));
    for (const StateSnapshot& s : st.snapshots) {
      if (s.position > step.begin && s.position < step.end && s.position < known)
        cuts.push_back(s.position);
    }
    break;  // every state group has the same positions
  }
  cuts.push_back(step.end);
  return cuts;
}

}  // namespace

Engine::Impl::Impl(const ModelSpec& spec, const ModelWeights& weights, KvCacheManager manager,
                   PagedKvCache cache, const EngineOptions& options)
    : spec_(spec),
      weights_(weights),
      manager_(std::make_unique<KvCacheManager>(std::move(manager))),
      cache_(std::move(cache)),
      options_(options) {
  for (const GroupConfig& g : manager_->config().groups)
    has_state_ = has_state_ || g.is_state();
}

Result<std::unique_ptr<Engine>> Engine::Create(const ModelSpec& spec, const ModelWeights& weights,
                                               const Plan& plan, const ManagerConfig& config,
                                               const EngineOptions& options) {
  if (options.token_budget < 1) {
    return Status::InvalidArgument(
        fmt::format("engine: token budget {}: expected >= 1", options.token_budget));
  }
  if (options.chunk < 1) {
    return Status::InvalidArgument(fmt::format("engine: chunk {}: expected >= 1", options.chunk));
  }
  if (options.draft_tokens < 0) {
    return Status::InvalidArgument(
        fmt::format("engine: draft tokens {}: expected >= 0", options.draft_tokens));
  }
  if (options.lookahead < 0) {
    return Status::InvalidArgument(
        fmt::format("engine: lookahead {}: expected >= 0", options.lookahead));
  }
  std::vector<Impl::SparseLayer> sparse_layers;
  std::vector<int32_t> sparse_groups;
  if (options.sparse) {
    if (options.draft_tokens > 0) {
      return Status::InvalidArgument(fmt::format(
          "engine: sparse-KV policies with {} draft tokens: a request that evicted tokens cannot "
          "roll rejected drafts back",
          options.draft_tokens));
    }
    HKV_RETURN_IF_ERROR(MakePolicy(options.sparse->policy).status());
    for (const KvGroup& g : plan.groups) {
      if (g.rule.kind != TokenRuleKind::kAll) continue;
      sparse_groups.push_back(g.id);
      for (int32_t l : g.layers) {
        const LayerSpec& ls = spec.layers[static_cast<size_t>(l)];
        const bool mla = ls.kind == LayerKind::kMla;
        sparse_layers.push_back({l, g.id, mla ? 1 : ls.num_kv_heads,
                                 mla ? ls.head_dim_k : ls.num_kv_heads * ls.head_dim_k,
                                 mla ? 0 : ls.num_kv_heads * ls.head_dim_v});
      }
    }
    if (sparse_layers.empty()) {
      return Status::InvalidArgument(
          "engine: sparse-KV policies need a full-attention or MLA layer; this model has none "
          "(windows, chunks and recurrent layers bound their memory already)");
    }
  }
  // The cache is laid out from the plan and indexed by the manager's block ids.
  HKV_RETURN_IF_ERROR(config.CheckMatches(plan));
  HKV_ASSIGN_OR_RETURN(KvCacheManager manager, KvCacheManager::Create(config));
  HKV_ASSIGN_OR_RETURN(PagedKvCache cache, PagedKvCache::Create(plan));
  auto impl = std::make_unique<Impl>(spec, weights, std::move(manager), std::move(cache), options);
  impl->sparse_layers_ = std::move(sparse_layers);
  impl->sparse_groups_ = std::move(sparse_groups);
  if (options.offload) {
    const std::vector<std::span<unsigned char>> buffers = impl->cache_.Buffers();
    HKV_ASSIGN_OR_RETURN(BlockMemoryView view, BlockMemoryView::Create(plan, buffers));
    impl->view_ = std::make_unique<BlockMemoryView>(std::move(view));
    HKV_ASSIGN_OR_RETURN(impl->connector_,
                         TierConnector::Create(*impl->view_, options.offload->tiers));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Status Engine::Submit(const GenerationRequest& request) {
  return impl_->Submit(request);
}
Status Engine::Step() {
  return impl_->Step();
}
bool Engine::idle() const {
  return impl_->running_.empty() && impl_->waiting_.empty();
}
const std::vector<Sequence>& Engine::finished() const {
  return impl_->finished_;
}
const EngineCounters& Engine::counters() const {
  return impl_->counters_;
}
const KvCacheManager& Engine::manager() const {
  return *impl_->manager_;
}
const TierConnector* Engine::connector() const {
  return impl_->connector_.get();
}
const BlockMemoryView* Engine::memory_view() const {
  return impl_->view_.get();
}

Status Engine::Impl::Submit(const GenerationRequest& request) {
  if (request.prompt.empty()) {
    return Status::InvalidArgument(
        fmt::format("engine: request {}: prompt is empty: expected at least 1 token", request.id));
  }
  if (request.max_new_tokens < 1) {
    return Status::InvalidArgument(
        fmt::format("engine: request {}: max_new_tokens = {}: expected >= 1", request.id,
                    request.max_new_tokens));
  }
  if (request.num_samples < 1) {
    return Status::InvalidArgument(fmt::format(
        "engine: request {}: num_samples = {}: expected >= 1", request.id, request.num_samples));
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t t = request.prompt[i];
    if (t < 0 || t >= weights_.vocab) {
      return Status::InvalidArgument(fmt::format(
          "engine: request {}: token {} at position {} is outside the vocabulary [0, {})",
          request.id, t, i, weights_.vocab));
    }
  }
  const int64_t max_encoder = manager_->config().max_encoder_tokens;
  if (request.encoder.tokens < 0 || request.encoder.tokens > max_encoder ||
      (max_encoder > 0) != (request.encoder.tokens > 0)) {
    return Status::InvalidArgument(
        fmt::format("engine: request {}: {} encoder tokens; this model takes {}", request.id,
                    request.encoder.tokens,
                    max_encoder > 0 ? fmt::format("1..{}", max_encoder) : std::string("none")));
  }
  // Forked siblings take the ids after the request's: the whole range must be free.
  const RequestId last = request.id + static_cast<RequestId>(request.num_samples - 1);
  const auto clashes = [&](const Live& l) {
    const RequestId l_last = l.seq.id + static_cast<RequestId>(l.num_samples - 1);
    return l.seq.id <= last && request.id <= l_last;
  };
  if (last < request.id) {
    return Status::InvalidArgument(
        fmt::format("engine: request {}: num_samples = {}: the sibling ids run past the largest "
                    "request id",
                    request.id, request.num_samples));
  }
  const auto refuse_clash = [&](const Live& l, const char* where) {
    return Status::InvalidArgument(fmt::format(
        "engine: request ids {}..{} overlap those of {} request {} ({}..{})", request.id, last,
        where, l.seq.id, l.seq.id, l.seq.id + static_cast<RequestId>(l.num_samples - 1)));
  };
  for (const auto& l : waiting_) {
    if (clashes(*l)) return refuse_clash(*l, "queued");
  }
  for (const auto& l : running_) {
    if (clashes(*l)) return refuse_clash(*l, "running");
  }
  auto r = std::make_unique<Live>();
  r->seq.id = request.id;
  r->seq.tokens = request.prompt;
  r->seq.prompt_len = static_cast<int64_t>(request.prompt.size());
  r->seq.greedy = request.greedy;
  r->seq.encoder = request.encoder;
  r->seq.retention = request.retention;
  r->max_new_tokens = request.max_new_tokens;
  r->num_samples = request.num_samples;
  r->rng = SplitMix64(request.seed);
  waiting_.push_back(std::move(r));
  return Status::Ok();
}

Status Engine::Impl::AfterManagerCall() {
  if (options_.poison_free_blocks) HKV_RETURN_IF_ERROR(cache_.PoisonFreeBlocks(*manager_));
  if (!connector_ && options_.kv_events == nullptr) return Status::Ok();
  const std::vector<ManagerEvent> events = manager_->TakeEvents();
  if (events.empty()) return Status::Ok();
  // Published blocks are exported now, before any later call can hand them out again. In a
  // batch, blocks published at Allocate hold KV only once the batch has run, so their stores wait
  // for it; a block whose identity leaves it before then (evicted by a later Allocate of the
  // batch, withdrawn, or its key taken over by a newer copy and the block handed out again) may
  // be overwritten by the batch, so its pending store is dropped.
  if (connector_ && options_.offload->store) {
    if (options_.batched) {
      for (const ManagerEvent& e : events) {
        if (e.kind == KvEvent::Kind::kStored) {
          store_after_batch_.push_back(e);
          continue;
        }
        std::erase_if(store_after_batch_, [&](const ManagerEvent& p) {
          return e.kind == KvEvent::Kind::kCleared ? p.pool == e.pool
                                                   : p.pool == e.pool && p.block == e.block &&
                                                         p.group == e.group && p.hash == e.hash;
        });
      }
    } else {
      HKV_RETURN_IF_ERROR(connector_->Store(events));
    }
  }
  const RequestTokens tokens =
      options_.kv_events != nullptr ? TokensOf(*manager_) : RequestTokens{};
  if (options_.kv_events != nullptr) {
    HKV_RETURN_IF_ERROR(options_.kv_events->Publish(events, tokens));
  }
  if (connector_) HKV_RETURN_IF_ERROR(PublishTierEvents(tokens));
  return Status::Ok();
}

Status Engine::Impl::PublishTierEvents(const RequestTokens& tokens) {
  // Taken every time, so they never pile up; published, one batch per medium in the order the
  // tiers reported them, when the engine publishes events.
  tier_events_.clear();
  connector_->TakeEvents(tier_events_);
  if (options_.kv_events == nullptr) return Status::Ok();
  for (size_t i = 0; i < tier_events_.size();) {
    const std::string_view medium = tier_events_[i].medium;
    scratch_events_.clear();
    for (; i < tier_events_.size() && tier_events_[i].medium == medium; ++i)
      scratch_events_.push_back(tier_events_[i].event);
    HKV_RETURN_IF_ERROR(options_.kv_events->Publish(scratch_events_, tokens, medium));
  }
  return Status::Ok();
}

Status Engine::Impl::MaybeCompact() {
  if (!options_.compact || !manager_->config().arena.enabled()) return Status::Ok();
  // A loading request's step is open (its blocks are being written): pages stay where they are.
  if (std::any_of(running_.begin(), running_.end(), [](const auto& l) { return l->loading; })) {
    return Status::Ok();
  }
  // Classes not due keep their cached pages: only the due ones are compacted.
  int32_t for_pool = -1;
  const bool due = CompactionDue(*manager_, refused_since_compaction_, compact_limits_, for_pool);
  refused_since_compaction_ = false;
  if (!due) return Status::Ok();
  const int64_t cached_before = manager_->Arena().cached_pages_moved;
  HKV_ASSIGN_OR_RETURN(const CompactionResult r,
                       for_pool >= 0 ? manager_->CompactFor(for_pool, compact_limits_)
                                     : manager_->Compact(compact_limits_));
  cache_.ApplyMoves(r.moves);
  HKV_RETURN_IF_ERROR(AfterManagerCall());
  counters_.compactions += r.slabs.empty() ? 0 : 1;
  counters_.pages_moved += static_cast<int64_t>(r.moves.size());
  counters_.slabs_compacted += static_cast<int64_t>(r.slabs.size());
  if (for_pool >= 0 && !r.slabs.empty()) {
    ++(manager_->config().pool_holds_states(for_pool) ? counters_.compactions_for_states
                                                      : counters_.compactions_for_cache);
  }
  counters_.cached_pages_moved += manager_->Arena().cached_pages_moved - cached_before;
  return Status::Ok();
}

int64_t Engine::Impl::WindowNulls(RequestId id) const {
  int64_t nulls = 0;
  const auto& groups = manager_->config().groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    const TokenRuleKind k = groups[g].rule.kind;
    if (k != TokenRuleKind::kWindow && k != TokenRuleKind::kChunk) continue;
    auto table = manager_->BlockTable(id, static_cast<int32_t>(g));
    if (!table.ok()) continue;
    nulls += std::count(table->begin(), table->end(), BlockPool::kNullBlock);
  }
  return nulls;
}

Status Engine::Impl::Admit(Live& r) {
  RequestSpec spec;
  spec.id = r.seq.id;
  spec.prompt = r.seq.tokens;
  spec.retention = r.seq.retention;
  spec.encoder_tokens = r.seq.encoder.tokens;
  // The stand-in encoder's output is a function of the image id alone: it is the input digest.
  spec.encoder_input = {r.seq.encoder.image, 0x1a6e};
  HKV_RETURN_IF_ERROR(manager_->AddRequest(spec));
  return Status::Ok();
}

// Frees `victim` and puts it at the front of the queue with all its known tokens.
Status Engine::Impl::Preempt(const Live* victim) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& p) { return p.get() == victim; });
  std::unique_ptr<Live> v = std::move(*it);
  running_.erase(it);
  if (v->loading) {
    connector_->Forget(v->seq.id);  // waits until nothing writes its blocks any more
    v->loading = false;
    v->load_drafts.clear();
  }
  HKV_RETURN_IF_ERROR(manager_->Free(v->seq.id, FreeReason::kPreempted));
  HKV_RETURN_IF_ERROR(AfterManagerCall());
  v->started = false;
  ++counters_.preemptions;
  preempted_this_step_ = true;
  waiting_.push_front(std::move(v));
  return Status::Ok();
}

int32_t Engine::Impl::Sample(Live& r, std::span<const float> logits, int64_t pos) {
  if (r.seq.greedy) return Argmax(logits);
  const double u = r.rng.Unit();
  r.seq.draws[pos] = u;
  return PickByDraw(logits, u);
}

Status Engine::Impl::FinishOrSample(Live& r, const std::vector<float>& last_logits, int64_t pos) {
  std::vector<Live*> samplers{&r};
  if (r.num_samples > 1 && !r.forked) {
    r.forked = true;
    for (int32_t s = 1; s < r.num_samples; ++s) {
      auto child = std::make_unique<Live>(r);
      child->seq.id = r.seq.id + static_cast<RequestId>(s);
      child->rng = SplitMix64(r.rng.state() + 0x1000u * static_cast<uint64_t>(s));
      HKV_RETURN_IF_ERROR(manager_->Fork(r.seq.id, child->seq.id));
      ++counters_.forks;
      samplers.push_back(child.get());
      running_.push_back(std::move(child));
    }
  }
  for (Live* s : samplers) {
    const int32_t next = Sample(*s, last_logits, pos + 1);
    s->seq.tokens.push_back(next);
    HKV_RETURN_IF_ERROR(manager_->AppendTokens(s->seq.id, {&next, 1}));
  }
  return Status::Ok();
}

Result<bool> Engine::Impl::AllocateStep(Live& r, int64_t computed, int64_t n,
                                        const std::vector<int32_t>& drafts) {
  const RequestId id = r.seq.id;
  const PrefixHit hit = r.started ? PrefixHit{} : r.pending;
  const int64_t total = n + static_cast<int64_t>(drafts.size());
  if (!r.started && options_.sparse) HKV_RETURN_IF_ERROR(StartSparse(r, hit.tokens));
  // Out of blocks: preempt the newest request admitted after this one and retry; if this one is
  // the newest, it yields itself. The oldest request therefore always makes progress.
  HKV_ASSIGN_OR_RETURN(const bool allocated,
                       common_internal::AllocateOrPreempt(
                           running_, &r,
                           [&] {
                             // Lookahead never reaches past the model's length: the manager would
                             // refuse the step.
                             const int64_t lookahead = std::clamp<int64_t>(
                                 manager_->config().max_model_len - computed - total, 0,
                                 options_.lookahead);
                             return manager_->Allocate(id, total, hit, lookahead);
                           },
                           [&](const Live* victim, const Status& refusal) {
                             refused_since_compaction_ = true;
                             if (victim == &r && running_.size() == 1)
                               return DoesNotFitAlone(id, refusal);
                             return Preempt(victim);
                           }));
  if (!allocated) return false;
  // Copy sources are released at Allocate: a batch copies before any later call reuses them.
  if (options_.batched) {
    HKV_ASSIGN_OR_RETURN(const StepInfo step, manager_->Step(id));
    cache_.ApplyCopies(step.copies);
  }
  HKV_RETURN_IF_ERROR(AfterManagerCall());
  r.started = true;
  if (hit.tokens > 0) {
    counters_.prefix_hit_tokens += hit.tokens;
    if (has_state_) {
      ++counters_.checkpoint_hits;
      if (counters_.shortest_checkpoint_hit == 0 || hit.tokens < counters_.shortest_checkpoint_hit)
        counters_.shortest_checkpoint_hit = hit.tokens;
    }
  }
  if (hit.encoder) ++counters_.cross_attention_reuses;
  if (hit.loads > 0) {
    // The step runs once its blocks are in (Step polls the connector).
    HKV_ASSIGN_OR_RETURN(const StepInfo step, manager_->Step(id));
    HKV_RETURN_IF_ERROR(connector_->StartLoad(id, step.loads));
    r.loading = true;
    r.load_drafts = drafts;
    ++counters_.external_hits;
    counters_.external_hit_tokens += hit.tokens;
    return true;
  }
  return true;
}

Status Engine::Impl::RunOrQueue(Live* r, std::vector<int32_t> drafts) {
  if (options_.batched) {
    batch_.emplace_back(r, std::move(drafts));
    return Status::Ok();
  }
  HKV_RETURN_IF_ERROR(Execute(*r, drafts).status());
  return MaybeFinish(r);
}

Status Engine::Impl::RunBatch() {
  for (auto& [r, drafts] : batch_) {
    HKV_RETURN_IF_ERROR(Execute(*r, drafts).status());
    HKV_RETURN_IF_ERROR(MaybeFinish(r));
  }
  batch_.clear();
  if (store_after_batch_.empty()) return Status::Ok();
  const Status stored = connector_->Store(store_after_batch_);
  store_after_batch_.clear();
  return stored;
}

Status Engine::Impl::DoesNotFitAlone(RequestId id, const Status& refusal) const {
  std::string pools;
  for (size_t p = 0; p < manager_->config().pool_blocks.size(); ++p) {
    const PoolUsage u = manager_->Usage(static_cast<int32_t>(p));
    pools += fmt::format(" pool {}: {} of {} blocks free;", p, u.num_free, u.num_blocks);
  }
  return Status::ResourceExhausted(
      fmt::format("engine: request {} does not fit in the cache on its own: {};{}", id,
                  refusal.message(), pools));
}

Result<bool> Engine::Impl::EndLoad(Live& r, bool loaded) {
  const RequestId id = r.seq.id;
  connector_->Forget(id);
  HKV_RETURN_IF_ERROR(manager_->FinishLoad(id, loaded));
  HKV_RETURN_IF_ERROR(AfterManagerCall());
  r.loading = false;
  if (!loaded) r.load_drafts.clear();
  if (loaded) {
    ++counters_.loads_completed;
  } else {
    ++counters_.loads_failed;
    r.started = false;
    r.local_only = true;
  }
  return loaded;
}

Status Engine::Impl::MaybeFinish(Live* r) {
  if (static_cast<int64_t>(r->seq.tokens.size()) - r->seq.prompt_len < r->max_new_tokens ||
      !r->prefilled) {
    return Status::Ok();
  }
  HKV_RETURN_IF_ERROR(manager_->Free(r->seq.id));
  HKV_RETURN_IF_ERROR(AfterManagerCall());
  finished_.push_back(r->seq);
  std::erase_if(running_, [&](const auto& p) { return p.get() == r; });
  return Status::Ok();
}

Result<std::vector<float>> Engine::Impl::ForwardStep(Live& r, const StepInfo& step,
                                                     const std::vector<int32_t>& drafts) {
  if (!options_.batched) cache_.ApplyCopies(step.copies);
  HKV_ASSIGN_OR_RETURN(auto view, cache_.View(*manager_, r.seq.id));
  if (options_.sparse) PrepareSparse(r, step.begin, step.end, *view);
  std::vector<int32_t> tokens = r.seq.tokens;
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  // A sparse step runs whole (its policies observe the step's attention at once); sparse
  // requests publish nothing once they evict.
  std::vector<int64_t> cuts{step.begin, step.end};
  if (!options_.sparse) {
    HKV_ASSIGN_OR_RETURN(
        cuts, StepCuts(*manager_, r.seq.id, step, static_cast<int64_t>(r.seq.tokens.size())));
  }
  const auto splits = static_cast<int64_t>(cuts.size()) - 2;
  counters_.state_splits += splits;
  counters_.max_state_splits = std::max(counters_.max_state_splits, splits);
  std::vector<float> logits;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const std::vector<float> piece =
        Forward(spec_, weights_, tokens, cuts[k], cuts[k + 1], *view, r.seq.encoder);
    logits.insert(logits.end(), piece.begin(), piece.end());
  }
  HKV_RETURN_IF_ERROR(view->status());
  if (options_.sparse) {
    ShowWritten(r, *view);
    HKV_RETURN_IF_ERROR(view->status());
  }
  return logits;
}

Status Engine::Impl::CommitStep(RequestId id, int64_t end, int64_t commit_at) {
  if (commit_at < end && (truncate_toggle_++ % 2 == 1)) {
    HKV_RETURN_IF_ERROR(manager_->Commit(id, end));
    HKV_RETURN_IF_ERROR(AfterManagerCall());
    HKV_ASSIGN_OR_RETURN(const TruncateResult t, manager_->Truncate(id, commit_at));
    HKV_RETURN_IF_ERROR(AfterManagerCall());
    ++counters_.truncations;
    if (t.computed != commit_at) {
      return Status::FailedPrecondition(fmt::format(
          "engine: truncate of request {} to {} kept only {}", id, commit_at, t.computed));
    }
    return Status::Ok();
  }
  HKV_RETURN_IF_ERROR(manager_->Commit(id, commit_at));
  return AfterManagerCall();
}

Result<int64_t> Engine::Impl::Execute(Live& r, const std::vector<int32_t>& drafts) {
  const RequestId id = r.seq.id;
  HKV_ASSIGN_OR_RETURN(const StepInfo step, manager_->Step(id));
  HKV_ASSIGN_OR_RETURN(const std::vector<float> logits, ForwardStep(r, step, drafts));
  const auto vocab = static_cast<size_t>(weights_.vocab);
  const auto row = [&](int64_t p) {
    const auto at = static_cast<ptrdiff_t>(static_cast<size_t>(p - step.begin) * vocab);
    return std::vector<float>(logits.begin() + at,
                              logits.begin() + at + static_cast<ptrdiff_t>(vocab));
  };
  const int64_t nulls_before = WindowNulls(id);
  int64_t commit_at = step.end;
  int64_t accepted = 0;
  if (!drafts.empty()) {
    // Position begin is the last known token; its logits judge the first draft, and so on.
    while (accepted < static_cast<int64_t>(drafts.size()) &&
           Argmax(row(step.begin + accepted)) == drafts[static_cast<size_t>(accepted)]) {
      ++accepted;
    }
    counters_.drafts_accepted += accepted;
    counters_.drafts_rejected += static_cast<int64_t>(drafts.size()) - accepted;
    commit_at = step.begin + 1 + accepted;
  }
  HKV_RETURN_IF_ERROR(CommitStep(id, step.end, commit_at));
  // Drafts are refused with policies, so the step committed whole.
  if (options_.sparse) HKV_RETURN_IF_ERROR(FinishSparse(r, step.begin, step.end));
  counters_.window_blocks_freed += std::max<int64_t>(0, WindowNulls(id) - nulls_before);
  for (int64_t p = step.begin; p < commit_at; ++p) {
    r.seq.logits[p] = row(p);
    if (options_.sparse && options_.sparse->record_steps)
      r.seq.sparse_runs.back().logits[p] = r.seq.logits[p];
  }
  for (int64_t a = 0; a < accepted; ++a) {
    const int32_t t = drafts[static_cast<size_t>(a)];
    r.seq.tokens.push_back(t);
    HKV_RETURN_IF_ERROR(manager_->AppendTokens(id, {&t, 1}));
  }
  if (commit_at == static_cast<int64_t>(r.seq.tokens.size())) {
    r.prefilled = true;
    HKV_RETURN_IF_ERROR(FinishOrSample(r, row(commit_at - 1), commit_at - 1));
  }
  return step.end - step.begin;
}

// Admit a couple of waiting requests per step, none right after a step that had to preempt:
// memory is short, and a request admitted now would only be preempted again.
Status Engine::Impl::AdmitWaiting() {
  for (int admitted = 0;
       !waiting_.empty() && admitted < 2 && (!preempted_this_step_ || running_.empty());
       ++admitted) {
    std::unique_ptr<Live> r = std::move(waiting_.front());
    waiting_.pop_front();
    HKV_RETURN_IF_ERROR(Admit(*r));
    running_.push_back(std::move(r));
  }
  return Status::Ok();
}

Status Engine::Impl::StepRequest(Live* r, int64_t& budget, int64_t& executed) {
  const RequestId id = r->seq.id;
  if (r->loading) {
    const TierConnector::LoadState state = connector_->Poll(id);
    if (state == TierConnector::LoadState::kPending) return Status::Ok();
    HKV_ASSIGN_OR_RETURN(const bool loaded,
                         EndLoad(*r, state == TierConnector::LoadState::kLoaded));
    if (loaded) {
      std::vector<int32_t> drafts = std::move(r->load_drafts);
      r->load_drafts.clear();
      HKV_ASSIGN_OR_RETURN(const StepInfo step, manager_->Step(id));
      budget -= step.end - step.begin;
      ++executed;
      return RunOrQueue(r, std::move(drafts));
    }
    // Failed: the request starts over below, from a local lookup.
  }
  const int64_t known = static_cast<int64_t>(r->seq.tokens.size());
  if (!r->started) {
    // A hit stays valid until the next mutating call, so look up right before allocating.
    if (connector_ && options_.offload->load && !r->local_only) {
      HKV_ASSIGN_OR_RETURN(r->pending, manager_->Lookup(id, *connector_));
    } else {
      HKV_ASSIGN_OR_RETURN(r->pending, manager_->Lookup(id));
    }
  }
  const int64_t computed = r->started ? manager_->NumComputed(id).value() : r->pending.tokens;
  std::vector<int32_t> drafts;
  int64_t n = known - computed;
  if (n > 1 || !r->prefilled) {
    n = std::min({n, options_.chunk, budget});
  } else if (r->seq.greedy && options_.draft_tokens > 0) {
    const int64_t room = std::min<int64_t>({options_.draft_tokens, budget - 1,
                                            r->max_new_tokens - (known - r->seq.prompt_len) - 1,
                                            manager_->config().max_model_len - known - 1});
    std::vector<int32_t> context = r->seq.tokens;
    for (int64_t i = 0; i < room; ++i) {
      drafts.push_back(Draft(context, weights_.vocab));
      context.push_back(drafts.back());
    }
  }
  HKV_ASSIGN_OR_RETURN(const bool ran, AllocateStep(*r, computed, n, drafts));
  if (!ran) return Status::Ok();
  budget -= n + static_cast<int64_t>(drafts.size());
  if (r->loading) return Status::Ok();  // the step runs once its blocks are in
  ++executed;
  return RunOrQueue(r, std::move(drafts));
}

Status Engine::Impl::Step() {
  ++counters_.steps;
  const ManagerStats& ms = manager_->stats();
  counters_.branch_blocks_given_back = ms.branch_blocks_given_back;
  counters_.rolling_states_given_back = ms.rolling_states_given_back;
  counters_.remembered_branches_kept = ms.remembered_branches_kept;
  counters_.shared_prefixes_marked = ms.shared_prefixes_marked;
  counters_.thrash_probation_frees = ms.thrash_probation_frees;
  counters_.keys_taken_over = ms.keys_taken_over;
  counters_.admissions_held_for_headroom = ms.admissions_held_for_headroom;
  counters_.coverage_demotions =
      ms.uncovered_blocks_demoted + ms.unreachable_checkpoints_demoted + ms.superseded_hits_demoted;
  // No step is open between scheduler steps: pages may move now, before anything reads them.
  HKV_RETURN_IF_ERROR(MaybeCompact());
  HKV_RETURN_IF_ERROR(AdmitWaiting());
  preempted_this_step_ = false;
  int64_t budget = options_.token_budget;
  int64_t executed = 0;  // requests whose step ran
  // Snapshot the order: preemption and forks change running_ during the loop.
  std::vector<Live*> order;
  for (auto& r : running_)
    order.push_back(r.get());
  for (Live* r : order) {
    if (budget <= 0) break;
    const bool still_running =
        std::any_of(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == r; });
    if (!still_running) continue;
    HKV_RETURN_IF_ERROR(StepRequest(r, budget, executed));
  }
  if (options_.batched) HKV_RETURN_IF_ERROR(RunBatch());
  // Only loads are in flight: wait for the oldest rather than return a step that did nothing.
  if (executed == 0) {
    for (const auto& r : running_) {
      if (!r->loading) continue;
      connector_->Wait(r->seq.id);
      ++counters_.load_waits;
      break;
    }
  }
  return Status::Ok();
}

namespace {

// Compares every computed position's logits and every generated token with `reference` (rows of
// logits from position 0 on).
// Compares `logits` (positions computed) and the tokens sampled at positions [sampled_from,
// sampled_to) with `dense` (rows of reference logits from position 0 on).
DenseCheck CheckAgainst(const std::vector<float>& dense, const ModelWeights& weights,
                        const Sequence& seq, const std::map<int64_t, std::vector<float>>& logits,
                        int64_t sampled_from, int64_t sampled_to, float tolerance) {
  DenseCheck c;
  const auto vocab = static_cast<size_t>(weights.vocab);
  const auto dense_row = [&](int64_t p) {
    return std::span<const float>(dense.data() + static_cast<size_t>(p) * vocab, vocab);
  };
  const auto rows = static_cast<int64_t>(dense.size() / vocab);
  for (const auto& [p, row] : logits) {
    if (p >= rows) {
      ++c.mismatches;  // the reference never computed it: a record is missing
      continue;
    }
    float worst = 0.0f;
    const auto d = dense_row(p);
    for (size_t i = 0; i < vocab; ++i)
      worst = std::max(worst, std::fabs(row[i] - d[i]));
    c.max_logit_diff = std::max(c.max_logit_diff, worst);
    if (!(worst <= tolerance)) ++c.mismatches;
  }
  for (int64_t p = std::max(seq.prompt_len, sampled_from); p < sampled_to; ++p) {
    if (p - 1 >= rows) {
      ++c.mismatches;
      continue;
    }
    int32_t want = 0;
    if (seq.greedy) {
      want = Argmax(dense_row(p - 1));
    } else {
      auto draw = seq.draws.find(p);
      if (draw == seq.draws.end()) {
        ++c.mismatches;
        continue;
      }
      want = PickByDraw(dense_row(p - 1), draw->second);
    }
    if (want != seq.tokens[static_cast<size_t>(p)]) ++c.mismatches;
  }
  return c;
}

}  // namespace

DenseCheck CheckAgainstDense(const ModelSpec& spec, const ModelWeights& weights,
                             const Sequence& seq, float tolerance) {
  return CheckAgainst(DenseLogits(spec, weights, seq.tokens, seq.encoder), weights, seq, seq.logits,
                      0, static_cast<int64_t>(seq.tokens.size()), tolerance);
}

DenseCheck CheckAgainstMasked(const ModelSpec& spec, const ModelWeights& weights,
                              const Sequence& seq, float tolerance) {
  DenseCheck total;
  if (seq.sparse_runs.empty() && !seq.logits.empty()) total.mismatches = 1;  // nothing recorded
  for (size_t i = 0; i < seq.sparse_runs.size(); ++i) {
    const Sequence::SparseRun& run = seq.sparse_runs[i];
    const int64_t sampled_to = i + 1 < seq.sparse_runs.size()
                                   ? seq.sparse_runs[i + 1].tokens_before
                                   : static_cast<int64_t>(seq.tokens.size());
    const DenseCheck c =
        CheckAgainst(MaskedLogits(spec, weights, seq.tokens, run.steps, seq.encoder), weights, seq,
                     run.logits, run.tokens_before, sampled_to, tolerance);
    total.mismatches += c.mismatches;
    total.max_logit_diff = std::max(total.max_logit_diff, c.max_logit_diff);
  }
  return total;
}

}  // namespace hkv
