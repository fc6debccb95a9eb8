#include "sparse_eval_command.h"

#include <algorithm>
#include <iterator>
#include <ostream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hkv/spec/config_loader.h>

namespace hkv::cli {
namespace {

// The layer whose geometry the evaluation borrows: the first that keeps every token, which is
// where a sparse-KV policy would run (windowed layers already bound their cache).
struct Geometry {
  const LayerSpec* layer = nullptr;
  int32_t kv_heads = 0, group = 0, head_dim = 0;
};

Result<Geometry> PickLayer(const ModelSpec& model) {
  for (const LayerSpec& l : model.layers) {
    if (l.kind != LayerKind::kFullAttention && l.kind != LayerKind::kMla) continue;
    Geometry g;
    g.layer = &l;
    g.head_dim = l.head_dim_k;
    if (l.kind == LayerKind::kMla) {
      // Absorbed MLA attends one shared latent per token with every query head: one KV head.
      g.kv_heads = 1;
      g.group = l.num_q_heads;
    } else {
      if (l.num_kv_heads < 1 || l.num_q_heads % l.num_kv_heads != 0) {
        return Status::InvalidArgument(
            fmt::format("{}: layer {} has {} query heads for {} KV heads: expected a multiple",
                        model.source, l.layer, l.num_q_heads, l.num_kv_heads));
      }
      g.kv_heads = l.num_kv_heads;
      g.group = l.num_q_heads / l.num_kv_heads;
    }
    return g;
  }
  return Status::InvalidArgument(fmt::format(
      "{}: the model has no full-attention or MLA layer: sparse-KV policies choose among the "
      "tokens of layers that keep every token",
      model.source));
}

Result<std::vector<PolicyConfig>> ParsePolicies(const SparseEvalArgs& args) {
  std::vector<PolicyKind> kinds;
  const auto add = [&kinds](PolicyKind k) {
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  };
  for (const std::string& name : args.policies) {
    if (name == "all") {
      for (PolicyKind k : kAllPolicyKinds)
        add(k);
      continue;
    }
    Result<PolicyKind> k = ParsePolicyKind(name);
    if (!k.ok()) {
      std::string names;
      for (PolicyKind known : kAllPolicyKinds)
        names += fmt::format("{}, ", PolicyKindName(known));
      return Status::InvalidArgument(
          fmt::format("--policy '{}': expected one of {}or all", name, names));
    }
    add(*k);
  }
  if (kinds.empty()) kinds.assign(std::begin(kAllPolicyKinds), std::end(kAllPolicyKinds));
  std::vector<PolicyConfig> out;
  for (PolicyKind k : kinds) {
    PolicyConfig c = args.policy;
    c.kind = k;
    out.push_back(c);
  }
  return out;
}

Status CheckCounts(const SparseEvalArgs& args) {
  const SyntheticEvalOptions& o = args.options;
  const PolicyConfig& p = args.policy;
  const struct {
    const char* option;
    int64_t value, least;
  } counts[] = {{"--trials", o.trials, 1},
                {"--prompt-len", o.prompt_len, 2},
                {"--decode", o.decode_steps, 1},
                {"--chunk", o.chunk, 1},
                {"--question-tokens", o.question_tokens, 0},
                {"--sinks", p.sinks, 0},
                {"--recent", p.recent, 0},
                {"--window", p.window, 1}};
  for (const auto& c : counts) {
    if (c.value < c.least) {
      return Status::InvalidArgument(
          fmt::format("{} {}: expected >= {}", c.option, c.value, c.least));
    }
  }
  return Status::Ok();
}

struct Prepared {
  ModelSpec model;
  Geometry geometry;
  SyntheticEvalOptions options;
};

Result<Prepared> Prepare(const SparseEvalArgs& args) {
  HKV_RETURN_IF_ERROR(CheckCounts(args));
  Prepared p;
  p.options = args.options;
  HKV_ASSIGN_OR_RETURN(p.options.policies, ParsePolicies(args));
  const std::vector<std::string> defaults = {"0.1", "0.25", "0.5"};
  for (const std::string& text : args.budgets.empty() ? defaults : args.budgets) {
    Result<PolicyBudget> b = ParsePolicyBudget(text);
    if (!b.ok()) return Status::InvalidArgument(fmt::format("--budget: {}", b.status().message()));
    p.options.budgets.push_back(*b);
  }
  HKV_ASSIGN_OR_RETURN(p.model, LoadModelConfig(args.config));
  HKV_ASSIGN_OR_RETURN(p.geometry, PickLayer(p.model));
  p.options.num_kv_heads = p.geometry.kv_heads;
  p.options.group = p.geometry.group;
  p.options.head_dim = p.geometry.head_dim;
  return p;
}

std::string BudgetLabel(const PolicyBudget& b) {
  return b.is_fraction() ? fmt::format("{:g}%", b.share() * 100) : fmt::format("{}", b.tokens());
}

nlohmann::json ToJson(const Prepared& p, const SyntheticEvalReport& r) {
  const SyntheticEvalOptions& o = p.options;
  const PolicyConfig& c = o.policies.front();
  nlohmann::json j;
  j["model"] = p.model.source;
  j["model_type"] = p.model.model_type;
  j["layer"] = p.geometry.layer->layer;
  j["layer_kind"] = LayerKindName(p.geometry.layer->kind);
  j["geometry"] = {
      {"kv_heads", o.num_kv_heads}, {"query_heads_per_kv_head", o.group}, {"head_dim", o.head_dim}};
  j["options"] = {{"prompt_len", o.prompt_len},
                  {"decode_steps", o.decode_steps},
                  {"chunk", o.chunk},
                  {"trials", o.trials},
                  {"seed", o.seed},
                  {"question_tokens", o.question_tokens},
                  {"sinks", c.sinks},
                  {"recent", c.recent},
                  {"window", c.window},
                  {"kernel", c.kernel}};
  j["needle_dense_top"] = r.needle_dense_top;
  nlohmann::json results = nlohmann::json::array();
  for (const SyntheticEvalResult& x : r.results) {
    nlohmann::json e;
    e["policy"] = PolicyKindName(x.policy.kind);
    e["budget"] = x.budget.is_fraction() ? nlohmann::json(x.budget.share())
                                         : nlohmann::json(x.budget.tokens());
    e["budget_kind"] = x.budget.is_fraction() ? "fraction" : "tokens";
    e["budget_tokens"] = x.budget_tokens;
    e["mean_cache_tokens"] = x.mean_cache_tokens;
    e["needles_retrieved"] = x.needles_retrieved;
    e["needle_retrieval"] = static_cast<double>(x.needles_retrieved) / r.trials;
    e["mass"] = x.mean_mass;
    e["oracle_mass"] = x.mean_oracle_mass;
    e["ratio"] = x.mean_ratio;
    e["min_ratio"] = x.min_ratio;
    results.push_back(std::move(e));
  }
  j["results"] = std::move(results);
  return j;
}

void PrintTable(const Prepared& p, const SyntheticEvalReport& r, std::ostream& out) {
  const SyntheticEvalOptions& o = p.options;
  const PolicyConfig& c = o.policies.front();
  out << fmt::format(
      "hkv sparse-eval: {} ({}), layer {} ({}): {} KV heads x {} query heads, "
      "head_dim {}\n",
      p.model.source, p.model.model_type, p.geometry.layer->layer,
      LayerKindName(p.geometry.layer->kind), o.num_kv_heads, o.group, o.head_dim);
  out << fmt::format("  prompt {} tokens in chunks of {}, {} decode steps, {} trials, seed {}\n",
                     o.prompt_len, o.chunk, o.decode_steps, o.trials, o.seed);
  out << fmt::format("  streaming_llm sinks {}, h2o recent {}, snapkv window {} kernel {}\n",
                     c.sinks, c.recent, c.window, c.kernel);
  out << fmt::format(
      "  needle asked by the last {} prompt tokens and the last decode step; dense attention's "
      "top token then in {}/{} trials\n\n",
      o.question_tokens, r.needle_dense_top, r.trials);
  out << fmt::format("{:<14} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6}\n", "policy", "budget",
                     "tokens", "cache", "needle", "mass", "oracle", "ratio", "min");
  for (const SyntheticEvalResult& x : r.results) {
    out << fmt::format("{:<14} {:>7} {:>7} {:>7.1f} {:>7} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f}\n",
                       PolicyKindName(x.policy.kind), BudgetLabel(x.budget), x.budget_tokens,
                       x.mean_cache_tokens, fmt::format("{}/{}", x.needles_retrieved, r.trials),
                       x.mean_mass, x.mean_oracle_mass, x.mean_ratio, x.min_ratio);
  }
  out << "\ntokens: the budget at the last step; cache: tokens cached when a decode step attends "
         "(mean);\nneedle: trials whose needle was still cached when asked; mass: dense "
         "attention on the cache, mean over\ndecode steps; oracle: the most any set of that many "
         "tokens holds; ratio: mass / oracle per step,\nmean and min (the worst step).\n";
}

}  // namespace

CLI::App* AddSparseEvalCommand(CLI::App& app, SparseEvalArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "sparse-eval",
      "Synthetic evaluation of the sparse-KV policies: needle retrieval and attention mass kept "
      "vs the best possible set, per policy and budget, with a model's attention geometry");
  cmd->add_option("config", args.config, "config.json of the model, or the folder holding it")
      ->required();
  cmd->add_option("--policy", args.policies,
                  "dense, streaming_llm, h2o, tova, snapkv, knorm or all (default); repeat or "
                  "separate with commas")
      ->delimiter(',');
  cmd->add_option("--budget", args.budgets,
                  "tokens to keep: a count (64), a fraction of the tokens so far (0.25) or a "
                  "percentage (25%); repeat or separate with commas (default 0.1,0.25,0.5)")
      ->delimiter(',');
  cmd->add_flag("--json", args.json, "print one JSON document instead of the table");
  SyntheticEvalOptions& o = args.options;
  cmd->add_option("--seed", o.seed, "random seed; the same seed gives the same report")
      ->capture_default_str();
  cmd->add_option("--trials", o.trials, "sequences evaluated (needle positions)")
      ->capture_default_str();
  cmd->add_option("--prompt-len", o.prompt_len, "prompt tokens")->capture_default_str();
  cmd->add_option("--decode", o.decode_steps,
                  "decode steps after the prompt; the needle is "
                  "asked at the last")
      ->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "prompt tokens per step (chunked prefill)")
      ->capture_default_str();
  cmd->add_option("--question-tokens", o.question_tokens,
                  "last prompt tokens that ask for the needle (0: a cold needle)")
      ->capture_default_str();
  cmd->add_option("--sinks", args.policy.sinks, "streaming_llm: first tokens always kept")
      ->capture_default_str();
  cmd->add_option("--recent", args.policy.recent, "h2o, knorm: most recent tokens always kept")
      ->capture_default_str();
  cmd->add_option("--window", args.policy.window, "snapkv: observation window")
      ->capture_default_str();
  return cmd;
}

int RunSparseEvalCommand(const SparseEvalArgs& args, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](std::string_view message) {
    err << "hkv sparse-eval: error: " << message << "\n";
    return 2;
  };
  Result<Prepared> prepared = Prepare(args);
  if (!prepared.ok()) return fail(prepared.status().message());
  Result<SyntheticEvalReport> report = RunSyntheticEval(prepared->options);
  if (!report.ok()) return fail(report.status().message());
  if (args.json) {
    out << ToJson(*prepared, *report).dump(2) << "\n";
  } else {
    PrintTable(*prepared, *report, out);
  }
  return 0;
}

}  // namespace hkv::cli
