#include "page_sizing.h"

#include <algorithm>

#include <fmt/format.h>

#include "capacity.h"
#include "grouping.h"
#include "memory_layout.h"
#include "slab_sizing.h"

namespace hkv {
namespace {

// Groups with equal pages share a class, in order of first appearance; ids are renumbered.
void AssignPageClasses(std::vector<KvGroup>& groups, std::vector<PageClass>& classes) {
  classes.clear();
  for (size_t i = 0; i < groups.size(); ++i) {
    KvGroup& g = groups[i];
    g.id = static_cast<int32_t>(i);
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const PageClass& c) { return c.page_bytes == g.page_bytes; });
    if (it == classes.end()) {
      it = classes.insert(classes.end(), PageClass{});
      it->id = static_cast<int32_t>(classes.size() - 1);
      it->page_bytes = g.page_bytes;
    }
    g.page_class = it->id;
    it->groups.push_back(g.id);
  }
}

// Why no single page size fits this model, or "" when one does.
std::string SingleClassObstacle(const ModelSpec& model, const std::vector<KvGroup>& rule_groups) {
  for (const KvGroup& g : rule_groups) {
    if (g.is_state()) {
      return fmt::format(
          "the recurrent state ({} bytes per sequence) cannot share one page size with attention "
          "blocks",
          g.page_bytes);
    }
  }
  const LayerSpec* first = nullptr;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerSpec& l = model.layers[i];
    if (!l.owns_kv()) continue;
    if (first == nullptr) {
      first = &l;
    } else if (l.kv_bytes_per_token() != first->kv_bytes_per_token()) {
      return fmt::format(
          "layers keep different KV bytes per token (model layer {}: {}, model layer {}: {})",
          first->layer, first->kv_bytes_per_token(), l.layer, l.kv_bytes_per_token());
    }
  }
  if (first == nullptr) return "the model has no attention layer that owns its KV cache";
  return "";
}

// RFC milestone 1: every group gets the layer count of the smallest one, so one page fits all.
// Larger groups are cut into runs of consecutive layers; the last run is padded.
std::vector<KvGroup> SplitEqual(const std::vector<KvGroup>& rule_groups, int64_t layer_page_bytes) {
  size_t slots = rule_groups.front().layers.size();
  for (const KvGroup& g : rule_groups)
    slots = std::min(slots, g.layers.size());
  std::vector<KvGroup> out;
  for (const KvGroup& g : rule_groups) {
    for (size_t begin = 0; begin < g.layers.size(); begin += slots) {
      KvGroup& sub = out.emplace_back();
      sub.rule = g.rule;
      sub.block_tokens = g.block_tokens;
      const size_t end = std::min(g.layers.size(), begin + slots);
      sub.layers.assign(g.layers.begin() + static_cast<std::ptrdiff_t>(begin),
                        g.layers.begin() + static_cast<std::ptrdiff_t>(end));
      sub.padding_layers = static_cast<int32_t>(slots - (end - begin));
      sub.page_bytes = static_cast<int64_t>(slots) * layer_page_bytes;
    }
  }
  return out;
}

void Evaluate(const ModelSpec& model, const PlanOptions& o, int64_t uniform_bytes_per_token,
              Candidate& c) {
  AssignPageClasses(c.groups, c.classes);
  SetClassPageBytes(model, o.layout, c.groups, c.classes);
  int64_t slab = 0;
  if (c.summary.strategy == PageStrategy::kTwoLevel) {
    slab = ChooseSlabBytes(c.classes, o.memory_bytes);
    CarveClasses(slab, o.memory_bytes / slab, c.classes);
  }
  const Footprint f = ComputeFootprint(model, c.groups, c.classes, uniform_bytes_per_token,
                                       o.block_tokens, o.seq_tokens, o.encoder_tokens, slab);
  c.summary.feasible = true;
  c.summary.wasted_bytes = f.hybridkv_bytes - f.ideal_bytes;
  c.summary.sequence_bytes = f.hybridkv_bytes;
  c.summary.num_groups = static_cast<int32_t>(c.groups.size());
  c.summary.num_classes = static_cast<int32_t>(c.classes.size());
}

}  // namespace

std::vector<Candidate> PageCandidates(const ModelSpec& model,
                                      const std::vector<KvGroup>& rule_groups,
                                      const PlanOptions& options, int64_t uniform_bytes_per_token) {
  std::vector<Candidate> out(3);
  Candidate& single = out[0];
  single.summary.strategy = PageStrategy::kSingleClass;
  single.summary.why_not = SingleClassObstacle(model, rule_groups);
  if (single.summary.why_not.empty()) {
    // Every KV-owning layer has the same bytes per token here, so one layer's block is one slot.
    const int64_t layer_page =
        PageBytesOf(model, {rule_groups.front().layers.front()}, options.block_tokens);
    single.groups = SplitEqual(rule_groups, layer_page);
    Evaluate(model, options, uniform_bytes_per_token, single);
  }

  Candidate& multi = out[1];
  multi.summary.strategy = PageStrategy::kMultiClass;
  multi.groups = rule_groups;
  Evaluate(model, options, uniform_bytes_per_token, multi);

  Candidate& two = out[2];
  two.summary.strategy = PageStrategy::kTwoLevel;
  if (options.layout != TensorLayout::kCanonical) {
    two.summary.why_not =
        "the per-layer layout gives every layer slot its own region of a class buffer, which "
        "slabs shared between classes cannot";
  } else if (multi.classes.size() < 2) {
    two.summary.why_not = "every group has the same page size, so there is nothing to share";
  } else {
    two.groups = rule_groups;
    Evaluate(model, options, uniform_bytes_per_token, two);
  }
  return out;
}

Result<size_t> ChooseCandidate(const std::vector<Candidate>& candidates, PageStrategy strategy) {
  if (strategy != PageStrategy::kAuto) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      const PageCandidate& s = candidates[i].summary;
      if (s.strategy != strategy) continue;
      if (!s.feasible) {
        return Status::InvalidArgument(fmt::format("strategy = {}: not possible for this model: {}",
                                                   PageStrategyName(strategy), s.why_not));
      }
      return i;
    }
    return Status::InvalidArgument(
        fmt::format("strategy = {}: unknown page strategy", static_cast<int>(strategy)));
  }
  // Candidates are listed single class first, so strict < keeps it on a tie.
  size_t best = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PageCandidate& s = candidates[i].summary;
    if (!s.feasible || s.strategy == PageStrategy::kTwoLevel) continue;
    if (best == candidates.size() || s.wasted_bytes < candidates[best].summary.wasted_bytes)
      best = i;
  }
  // One pool is worth its padding up to 5% of a sequence: every group's blocks then share one
  // free list, so eviction keeps a prefix's groups together and any freed block serves any group,
  // where separate classes drift apart and hand memory over only a whole slab at a time
  // (Gemma-3-4B, 2.1% of padding at a 3,800-token sequence: docs/plan.md, "Page strategy").
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PageCandidate& s = candidates[i].summary;
    if (s.strategy == PageStrategy::kSingleClass && s.feasible &&
        20 * s.wasted_bytes <= s.sequence_bytes) {
      return i;
    }
  }
  // Where the fixed split of several classes wins, shared slabs serve the same classes for any
  // mix of requests rather than only the planning point's: worth their slab tails up to 1% of a
  // sequence.
  const PageCandidate& won = candidates[best].summary;
  if (won.strategy == PageStrategy::kMultiClass) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      const PageCandidate& s = candidates[i].summary;
      if (s.strategy == PageStrategy::kTwoLevel && s.feasible &&
          100 * (s.wasted_bytes - won.wasted_bytes) <= won.sequence_bytes) {
        return i;
      }
    }
  }
  return best;  // multi-class is always feasible
}

}  // namespace hkv
