#include "plan_report.h"

#include <algorithm>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hkv/common/byte_size.h>

namespace hkv::cli {
namespace {

// A group is named after its layers' kind when they all agree (e.g. "mla", "mamba2"), otherwise
// after its token rule.
std::string GroupKind(const Plan& plan, const KvGroup& g) {
  const auto& layers = plan.model.layers;
  const LayerKind first = layers[static_cast<size_t>(g.layers.front())].kind;
  const bool same = std::all_of(g.layers.begin(), g.layers.end(), [&](int32_t i) {
    return layers[static_cast<size_t>(i)].kind == first;
  });
  if (same) return std::string(LayerKindName(first));
  return g.is_state() ? "recurrent" : "attention";
}

std::vector<int32_t> ModelLayers(const Plan& plan, const KvGroup& g) {
  std::vector<int32_t> out;
  out.reserve(g.layers.size());
  for (int32_t i : g.layers)
    out.push_back(plan.model.layers[static_cast<size_t>(i)].layer);
  return out;
}

std::string Percent(double x) {
  return fmt::format("{:.2f}%", 100.0 * x);
}

nlohmann::json CandidatesJson(const Plan& plan) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const PageCandidate& c : plan.candidates) {
    nlohmann::json jc = {{"strategy", PageStrategyName(c.strategy)}, {"feasible", c.feasible}};
    if (c.feasible) {
      jc["wasted_bytes"] = c.wasted_bytes;
      jc["num_groups"] = c.num_groups;
      jc["num_classes"] = c.num_classes;
    } else {
      jc["why_not"] = c.why_not;
    }
    candidates.push_back(std::move(jc));
  }
  return candidates;
}

nlohmann::json GroupsJson(const Plan& plan) {
  nlohmann::json groups = nlohmann::json::array();
  for (const KvGroup& g : plan.groups) {
    groups.push_back({{"id", g.id},
                      {"kind", GroupKind(plan, g)},
                      {"rule", g.rule.Describe()},
                      {"layers", ModelLayers(plan, g)},
                      {"padding_layers", g.padding_layers},
                      {"block_tokens", g.block_tokens},
                      {"page_bytes", g.page_bytes},
                      {"page_class", g.page_class}});
  }
  return groups;
}

nlohmann::json PageClassesJson(const Plan& plan) {
  nlohmann::json classes = nlohmann::json::array();
  for (const PageClass& c : plan.page_classes) {
    classes.push_back({{"id", c.id},
                       {"page_bytes", c.page_bytes},
                       {"num_pages", c.num_pages},
                       {"buffer_bytes", c.buffer_bytes()},
                       {"pages_per_slab", c.pages_per_slab},
                       {"groups", c.groups}});
  }
  return classes;
}

nlohmann::json TensorsJson(const Plan& plan) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorView& t : plan.layout.tensors) {
    tensors.push_back({{"layer", plan.model.layers[static_cast<size_t>(t.layer)].layer},
                       {"name", t.name},
                       {"page_class", t.page_class},
                       {"offset", t.offset},
                       {"block_stride", t.block_stride},
                       {"bytes", t.bytes},
                       {"block_shape", t.block_shape},
                       {"dtype", DTypeName(t.dtype)}});
  }
  return tensors;
}

// Layer pattern, run-length encoded so 48-layer models stay on a few lines.
void PrintLayers(const ModelSpec& m, std::ostream& out) {
  out << "\nLayers\n";
  const std::vector<std::string> kinds = m.LayerKindNames();
  for (size_t i = 0; i < kinds.size();) {
    size_t j = i;
    while (j < kinds.size() && kinds[j] == kinds[i])
      ++j;
    out << fmt::format("  {:>3}{:<5} {}\n", i, j - i > 1 ? fmt::format("-{}", j - 1) : "",
                       kinds[i]);
    i = j;
  }
}

void PrintGroups(const Plan& plan, std::ostream& out) {
  out << "\nGroups (all layers of a group share one block table)\n";
  out << fmt::format("  {:>2}  {:<16} {:<22} {:>6} {:>4} {:>6} {:>12} {:>5}\n", "id", "kind",
                     "keeps", "layers", "pad", "block", "page", "class");
  for (const KvGroup& g : plan.groups) {
    out << fmt::format("  {:>2}  {:<16} {:<22} {:>6} {:>4} {:>6} {:>12} {:>5}\n", g.id,
                       GroupKind(plan, g), g.rule.Describe(), g.layers.size(), g.padding_layers,
                       g.is_state() ? std::string("state") : std::to_string(g.block_tokens),
                       FormatBytes(g.page_bytes), g.page_class);
  }
}

// The page classes and the page strategy chosen among the candidates.
void PrintPageClasses(const Plan& plan, std::ostream& out) {
  if (plan.arena.enabled()) {
    out << fmt::format("\nPage classes (one buffer of {} slabs of {} = {}, carved on demand)\n",
                       plan.arena.num_slabs, FormatBytes(plan.arena.slab_bytes),
                       FormatBytes(plan.arena.buffer_bytes()));
    for (const PageClass& c : plan.page_classes) {
      out << fmt::format("  class {}: {} pages of {} per slab (groups {})\n", c.id,
                         c.pages_per_slab, FormatBytes(c.page_bytes), fmt::join(c.groups, ", "));
    }
  } else {
    out << "\nPage classes (one buffer each)\n";
    for (const PageClass& c : plan.page_classes) {
      out << fmt::format("  class {}: {} pages of {} = {} (groups {})\n", c.id, c.num_pages,
                         FormatBytes(c.page_bytes), FormatBytes(c.buffer_bytes()),
                         fmt::join(c.groups, ", "));
    }
  }
  out << fmt::format("  strategy {}:", PageStrategyName(plan.strategy));
  for (const PageCandidate& c : plan.candidates) {
    if (c.feasible) {
      out << fmt::format("  {} wastes {} per sequence;", PageStrategyName(c.strategy),
                         FormatBytes(c.wasted_bytes));
    } else {
      out << fmt::format("  {} not possible ({});", PageStrategyName(c.strategy), c.why_not);
    }
  }
  out << "\n";
}

void PrintSequence(const Plan& plan, std::ostream& out) {
  const ModelSpec& m = plan.model;
  const Footprint f = plan.PlanningFootprint();
  out << fmt::format(
      "\nOne sequence of {} tokens{}\n", f.tokens,
      f.encoder_tokens > 0 ? fmt::format(" + {} encoder tokens", f.encoder_tokens) : std::string());
  out << fmt::format("  {:<10} {:>14} {:>9} {:>15}\n", "", "bytes", "waste", "max sequences");
  out << fmt::format("  {:<10} {:>14} {:>9} {:>15}\n", "ideal", FormatBytes(f.ideal_bytes), "", "");
  out << fmt::format("  {:<10} {:>14} {:>9} {:>15}\n", "hybridkv", FormatBytes(f.hybridkv_bytes),
                     Percent(f.hybridkv_waste()), plan.MaxSequences(f.tokens, f.encoder_tokens));
  out << fmt::format("  {:<10} {:>14} {:>9} {:>15}\n", "uniform", FormatBytes(f.uniform_bytes),
                     Percent(f.uniform_waste()),
                     plan.MaxSequencesUniform(f.tokens, f.encoder_tokens));
  out << fmt::format("  full-attention bytes per token {}, recurrent state per sequence {}\n",
                     m.bytes_per_token_full(), FormatBytes(m.state_bytes_per_sequence()));
}

void PrintLayout(const Plan& plan, std::ostream& out) {
  out << "\nLayout (block b of a tensor is at offset + b * stride)\n";
  out << fmt::format("  {:>5} {:<7} {:>5} {:>14} {:>12} {:>10}  {}\n", "layer", "tensor", "class",
                     "offset", "stride", "bytes", "block shape");
  for (const TensorView& t : plan.layout.tensors) {
    out << fmt::format("  {:>5} {:<7} {:>5} {:>14} {:>12} {:>10}  ({})\n",
                       plan.model.layers[static_cast<size_t>(t.layer)].layer, t.name, t.page_class,
                       t.offset, t.block_stride, t.bytes, fmt::join(t.block_shape, ", "));
  }
}

}  // namespace

nlohmann::json PlanToJson(const Plan& plan) {
  using nlohmann::json;
  const PlanOptions& o = plan.options;
  json doc;
  doc["model_type"] = plan.model.model_type;
  doc["source"] = plan.model.source;
  doc["num_layers"] = plan.model.num_layers;
  doc["layers"] = plan.model.LayerKindNames();
  doc["options"] = {{"memory_bytes", o.memory_bytes},     {"block_tokens", o.block_tokens},
                    {"max_model_len", o.max_model_len},   {"seq_tokens", o.seq_tokens},
                    {"encoder_tokens", o.encoder_tokens}, {"layout", TensorLayoutName(o.layout)}};
  doc["strategy"] = PageStrategyName(plan.strategy);
  doc["candidates"] = CandidatesJson(plan);
  doc["groups"] = GroupsJson(plan);
  doc["page_classes"] = PageClassesJson(plan);
  doc["arena"] = plan.arena.enabled() ? json{{"slab_bytes", plan.arena.slab_bytes},
                                             {"num_slabs", plan.arena.num_slabs},
                                             {"buffer_bytes", plan.arena.buffer_bytes()}}
                                      : json(nullptr);
  doc["num_blocks"] = plan.num_pages();
  doc["bytes_per_token_full"] = plan.model.bytes_per_token_full();
  doc["state_bytes_per_sequence"] = plan.model.state_bytes_per_sequence();
  doc["uniform_bytes_per_token"] = plan.uniform_bytes_per_token;
  const Footprint f = plan.PlanningFootprint();
  doc["sequence"] = {{"tokens", f.tokens},
                     {"encoder_tokens", f.encoder_tokens},
                     {"ideal_bytes", f.ideal_bytes},
                     {"hybridkv_bytes", f.hybridkv_bytes},
                     {"uniform_bytes", f.uniform_bytes},
                     {"hybridkv_waste", f.hybridkv_waste()},
                     {"uniform_waste", f.uniform_waste()},
                     {"pages_per_group", f.pages_per_group}};
  doc["max_sequences"] = {{"hybridkv", plan.MaxSequences(f.tokens, f.encoder_tokens)},
                          {"uniform", plan.MaxSequencesUniform(f.tokens, f.encoder_tokens)}};
  doc["layout"] = {{"kind", TensorLayoutName(o.layout)}, {"tensors", TensorsJson(plan)}};
  doc["warnings"] = plan.warnings;
  return doc;
}

void PrintPlanTable(const Plan& plan, bool show_layout, std::ostream& out) {
  const PlanOptions& o = plan.options;
  const ModelSpec& m = plan.model;
  out << fmt::format("hybridkv plan: {} ({}, {} layers)\n", m.source, m.model_type, m.num_layers);
  out << fmt::format("  memory {}, block {} tokens, max model len {}, layout {}\n",
                     FormatBytes(o.memory_bytes), o.block_tokens, o.max_model_len,
                     TensorLayoutName(o.layout));
  PrintLayers(m, out);
  PrintGroups(plan, out);
  PrintPageClasses(plan, out);
  PrintSequence(plan, out);
  if (show_layout) PrintLayout(plan, out);
}

nlohmann::json AllocatorsToJson(const std::vector<AllocatorReport>& reports) {
  using nlohmann::json;
  json list = json::array();
  for (const AllocatorReport& r : reports) {
    json j = {{"allocator", AllocatorModeName(r.mode)}};
    if (!r.allocator) {
      j["error"] = r.error;
      list.push_back(std::move(j));
      continue;
    }
    const Allocator& a = *r.allocator;
    j["block_tokens"] = a.block_tokens;
    j["state_page_bytes"] = a.state_page_bytes;
    j["pool_block_bytes"] = a.pool_block_bytes;
    j["bytes_per_sequence"] = r.planning.bytes_per_sequence;
    j["waste"] = r.planning.waste;
    j["max_sequences"] = r.planning.max_sequences;
    j["summary"] = a.summary;
    json lengths = json::array();
    for (const AllocatorFigures& f : r.lengths) {
      lengths.push_back({{"tokens", f.tokens},
                         {"bytes_per_sequence", f.bytes_per_sequence},
                         {"waste", f.waste},
                         {"max_sequences", f.max_sequences}});
    }
    j["lengths"] = std::move(lengths);
    list.push_back(std::move(j));
  }
  return list;
}

void PrintAllocatorTable(const Plan& plan, const std::vector<AllocatorReport>& reports,
                         bool show_lengths, std::ostream& out) {
  const PlanOptions& o = plan.options;
  const std::string encoder =
      o.encoder_tokens > 0 ? fmt::format(" + {} encoder tokens", o.encoder_tokens) : std::string();
  const auto max_text = [](int64_t n) {
    return n == std::numeric_limits<int64_t>::max() ? std::string("unbounded") : std::to_string(n);
  };
  out << fmt::format("\nAllocators (one sequence of {} tokens{}; waste against the ideal {})\n",
                     o.seq_tokens, encoder,
                     FormatBytes(IdealBytes(plan.model, o.seq_tokens, o.encoder_tokens)));
  out << fmt::format("  {:<9} {:>6} {:>12} {:>14} {:>9} {:>15}\n", "allocator", "block",
                     "state page", "bytes/seq", "waste", "max sequences");
  for (const AllocatorReport& r : reports) {
    if (!r.allocator) {
      out << fmt::format("  {:<9} cannot hold the model: {}\n", AllocatorModeName(r.mode), r.error);
      continue;
    }
    const Allocator& a = *r.allocator;
    out << fmt::format("  {:<9} {:>6} {:>12} {:>14} {:>9} {:>15}\n", AllocatorModeName(r.mode),
                       a.block_tokens,
                       a.state_page_bytes > 0 ? FormatBytes(a.state_page_bytes) : std::string("-"),
                       FormatBytes(r.planning.bytes_per_sequence), Percent(r.planning.waste),
                       max_text(r.planning.max_sequences));
  }
  for (const AllocatorReport& r : reports) {
    if (r.allocator) {
      out << fmt::format("  {:<9} {}\n", AllocatorModeName(r.mode), r.allocator->summary);
    }
  }
  if (!show_lengths) return;
  out << fmt::format("\nBy length (decoder tokens{})\n", encoder);
  out << fmt::format("  {:>8}  {:<9} {:>14} {:>9} {:>15}\n", "tokens", "allocator", "bytes/seq",
                     "waste", "max sequences");
  size_t num_lengths = 0;
  for (const AllocatorReport& r : reports)
    num_lengths = std::max(num_lengths, r.lengths.size());
  for (size_t i = 0; i < num_lengths; ++i) {
    for (const AllocatorReport& r : reports) {
      if (i >= r.lengths.size()) continue;  // a mode that cannot hold the model
      const AllocatorFigures& f = r.lengths[i];
      out << fmt::format("  {:>8}  {:<9} {:>14} {:>9} {:>15}\n", f.tokens,
                         AllocatorModeName(r.mode), FormatBytes(f.bytes_per_sequence),
                         Percent(f.waste), max_text(f.max_sequences));
    }
  }
}

}  // namespace hkv::cli
