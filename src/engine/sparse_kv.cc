// The engine's side of sparse-KV policies: the slots each sparse layer attends to in a step, the
// attention weights fed back, and the evictions that return whole blocks to the pools.
#include <algorithm>

#include <fmt/format.h>

#include <hkv/engine/engine.h>

#include "engine_impl.h"

namespace hkv {

Status Engine::Impl::StartSparse(Live& r, int64_t hit) {
  r.sparse.resize(sparse_layers_.size());
  for (SparseLayerState& s : r.sparse) {
    HKV_ASSIGN_OR_RETURN(s.policy, MakePolicy(options_.sparse->policy));
    s.shown = 0;
    // What a hit brings back was computed densely (nothing after an eviction is published), and
    // is held whole.
    s.kept.resize(static_cast<size_t>(hit));
    for (int64_t p = 0; p < hit; ++p)
      s.kept[static_cast<size_t>(p)] = p;
  }
  if (options_.sparse->record_steps) {
    Sequence::SparseRun& run = r.seq.sparse_runs.emplace_back();
    run.tokens_before = static_cast<int64_t>(r.seq.tokens.size());
    if (hit > 0) run.steps.push_back({0, hit, {}, {}});
  }
  return Status::Ok();
}

void Engine::Impl::PrepareSparse(Live& r, int64_t begin, int64_t end,
                                 PagedKvCache::StepView& view) {
  const size_t n = sparse_layers_.size();
  step_positions_.resize(n);
  step_feedback_.resize(n);
  step_views_.resize(n);
  const PolicyStep step{begin, static_cast<int32_t>(end - begin),
                        begin < r.seq.prompt_len && r.seq.prompt_len <= end};
  for (size_t i = 0; i < n; ++i) {
    const SparseLayerState& s = r.sparse[i];
    std::vector<int64_t>& pos = step_positions_[i];
    pos.assign(s.kept.begin(), s.kept.end());
    for (int64_t p = begin; p < end; ++p)
      pos.push_back(p);
    const int32_t rows = std::min<int32_t>(s.policy->AttentionRows(step), step.count);
    std::vector<float>& fb = step_feedback_[i];
    fb.assign(rows > 0 ? pos.size() * static_cast<size_t>(sparse_layers_[i].kv_heads) : 0, 0.0f);
    step_views_[i] = SlotView{pos, static_cast<int64_t>(s.kept.size()), rows, fb};
    view.SetSlots(sparse_layers_[i].layer, &step_views_[i]);
  }
}

void Engine::Impl::ShowWritten(Live& r, PagedKvCache::StepView& view) {
  for (size_t i = 0; i < sparse_layers_.size(); ++i) {
    SparseLayerState& s = r.sparse[i];
    if (!s.policy->WantsKeys()) continue;
    const SparseLayer& l = sparse_layers_[i];
    const std::vector<int64_t>& pos = step_positions_[i];
    const auto n = static_cast<int64_t>(pos.size());
    const auto kw = static_cast<size_t>(l.key_width), vw = static_cast<size_t>(l.value_width);
    shown_keys_.clear();
    shown_values_.clear();
    for (int64_t slot = s.shown; slot < n;) {
      const KvRows rows = view.Rows(l.layer, slot);
      const int64_t take = std::clamp<int64_t>(rows.n, 1, n - slot);
      shown_keys_.insert(shown_keys_.end(), rows.k, rows.k + static_cast<size_t>(take) * kw);
      if (vw > 0 && rows.v != nullptr)
        shown_values_.insert(shown_values_.end(), rows.v, rows.v + static_cast<size_t>(take) * vw);
      slot += take;
    }
    s.policy->Written({std::span<const int64_t>(pos).subspan(static_cast<size_t>(s.shown)),
                       l.kv_heads, l.key_width, l.value_width, shown_keys_, shown_values_});
    s.shown = n;
  }
}

// Records the step (record_steps), feeds each policy the step's attention and has it select the
// slots it keeps, into step_keep_.
void Engine::Impl::ObserveSparse(Live& r, int64_t begin, int64_t end) {
  const size_t n = sparse_layers_.size();
  const PolicyStep step{begin, static_cast<int32_t>(end - begin),
                        begin < r.seq.prompt_len && r.seq.prompt_len <= end};
  if (options_.sparse->record_steps) {
    SparseStepRecord rec{begin, end, {}, {}};
    for (size_t i = 0; i < n; ++i) {
      rec.layers.push_back(sparse_layers_[i].layer);
      rec.kept.push_back(r.sparse[i].kept);
    }
    r.seq.sparse_runs.back().steps.push_back(std::move(rec));
  }
  const int64_t budget = options_.sparse->budget.Resolve(end);
  step_keep_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    KvPolicy& policy = *r.sparse[i].policy;
    const SlotView& v = step_views_[i];
    policy.Observe(step_positions_[i], step,
                   {sparse_layers_[i].kv_heads, v.feedback_rows, step_feedback_[i]});
    step_keep_[i].clear();
    policy.Select(step_positions_[i], budget, step_keep_[i]);
  }
}

// Evicts group `g` of request `id` down to the `keep` slots its layers selected, the first
// `unchanged` in place, and moves the kept rows; false when the eviction had to wait for blocks.
Result<bool> Engine::Impl::EvictSparseGroup(RequestId id, int32_t g, int64_t keep, int64_t held,
                                            int64_t unchanged) {
  HKV_ASSIGN_OR_RETURN(const std::span<const int32_t> before, manager_->BlockTable(id, g));
  old_table_.assign(before.begin(), before.end());
  const Result<EvictResult> e = manager_->Evict(id, g, keep, unchanged);
  if (e.ok()) {
    HKV_ASSIGN_OR_RETURN(const std::span<const int32_t> after, manager_->BlockTable(id, g));
    for (size_t i = 0; i < sparse_layers_.size(); ++i) {
      if (sparse_layers_[i].group != g) continue;
      cache_.MoveSlots(sparse_layers_[i].layer, old_table_, after, step_keep_[i], e->write_from);
    }
    // Only now may freed blocks be poisoned: the moves read them.
    HKV_RETURN_IF_ERROR(AfterManagerCall());
    ++counters_.evictions;
    counters_.tokens_evicted += held - keep;
    counters_.blocks_evicted += e->blocks_released;
    return true;
  }
  if (e.status().code() == StatusCode::kResourceExhausted) {
    ++counters_.evictions_deferred;
    return false;
  }
  return e.status();
}

Status Engine::Impl::FinishSparseGroup(Live& r, int32_t g) {
  const size_t n = sparse_layers_.size();
  const RequestId id = r.seq.id;
  int64_t keep = -1, held = 0, unchanged = 0;
  for (size_t i = 0; i < n; ++i) {
    if (sparse_layers_[i].group != g) continue;
    const std::vector<int32_t>& k = step_keep_[i];
    const auto count = static_cast<int64_t>(k.size());
    if (keep >= 0 && count != keep) {
      return Status::FailedPrecondition(fmt::format(
          "engine: request {}: the layers of group {} keep {} and {} tokens; one table serves "
          "them, so a policy must keep as many in each",
          id, g, keep, count));
    }
    int64_t same = 0;
    while (same < count && k[static_cast<size_t>(same)] == same)
      ++same;
    unchanged = keep < 0 ? same : std::min(unchanged, same);
    keep = count;
    held = static_cast<int64_t>(step_positions_[i].size());
  }
  bool evicted = false;
  if (keep < held) {
    HKV_ASSIGN_OR_RETURN(evicted, EvictSparseGroup(id, g, keep, held, unchanged));
  }
  for (size_t i = 0; i < n; ++i) {
    if (sparse_layers_[i].group != g) continue;
    SparseLayerState& s = r.sparse[i];
    std::vector<int64_t>& pos = step_positions_[i];
    if (!evicted) {
      s.kept.swap(pos);  // the step's view is done with; PrepareSparse refills it
      continue;
    }
    s.policy->Compact(step_keep_[i]);
    s.shown = static_cast<int64_t>(step_keep_[i].size());
    s.kept.clear();
    for (int32_t slot : step_keep_[i])
      s.kept.push_back(pos[static_cast<size_t>(slot)]);
  }
  return Status::Ok();
}

Status Engine::Impl::FinishSparse(Live& r, int64_t begin, int64_t end) {
  ObserveSparse(r, begin, end);
  for (const int32_t g : sparse_groups_) {
    HKV_RETURN_IF_ERROR(FinishSparseGroup(r, g));
  }
  return Status::Ok();
}

}  // namespace hkv
