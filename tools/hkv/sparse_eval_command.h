// `hkv sparse-eval CONFIG`: the synthetic evaluation of the sparse-KV policies
// (hkv/policy/synthetic_eval.h) with the attention geometry of a model.
//
// Contract: AddSparseEvalCommand registers `sparse-eval` and its options on `app`; after parsing,
// RunSparseEvalCommand loads CONFIG, takes the geometry (KV heads, query heads per KV head, head
// width) of its first full-attention or MLA layer, runs every requested policy under every budget,
// and writes one table (or, with --json, one JSON document) to `out`. It returns 0 on success and
// 2, with a message on `err` naming the option or value, when the config cannot be read, the model
// has no full-attention or MLA layer, or an option is out of range (an unknown policy, a budget of
// 0 tokens or a fraction outside (0, 1], a negative count).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <hkv/policy/policies.h>
#include <hkv/policy/synthetic_eval.h>

namespace hkv::cli {

struct SparseEvalArgs {
  std::string config;
  std::vector<std::string> policies;  // names or "all"; empty: all
  std::vector<std::string> budgets;   // ParsePolicyBudget's forms; empty: 0.1, 0.25, 0.5
  bool json = false;
  SyntheticEvalOptions options;  // geometry, policies and budgets are filled in by the command
  PolicyConfig policy;           // sinks, recent and window for every policy that reads them
};

CLI::App* AddSparseEvalCommand(CLI::App& app, SparseEvalArgs& args);
int RunSparseEvalCommand(const SparseEvalArgs& args, std::ostream& out, std::ostream& err);

}  // namespace hkv::cli
