// `hkv plan`: plan KV memory for a model config and report it for people (table) or scripts
// (--json).
//
// Contract: AddPlanCommand registers the subcommand and its options on `app`; after parsing,
// RunPlanCommand loads the config, plans, and writes the report to `out` (errors to `err`),
// returning the process exit code: 0 on success, 1 when the config or options are rejected.
// With `allocator` set ("uniform", "padded", "hybridkv" or "all") the report also compares the
// allocator modes (MakeAllocator) at the planning point and at `lengths`; a mode that cannot
// hold the model is reported with its error, and the exit code is 1 only if no mode could.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace hkv::cli {

struct PlanArgs {
  std::string config;
  std::string memory = "16GiB";
  int64_t max_model_len = 0;
  int64_t seq_len = 0;
  int64_t encoder_tokens = -1;
  int64_t block_tokens = 16;
  std::string kv_dtype = "bf16";
  std::string state_dtype = "bf16";
  std::string conv_dtype;  // empty: same as kv dtype
  std::string layout = "canonical";
  std::string strategy = "auto";
  bool json = false;
  bool show_layout = false;
  std::string allocator;         // empty: the plan report only
  std::vector<int64_t> lengths;  // decoder tokens to compare allocators at; empty: --seq-len
};

CLI::App* AddPlanCommand(CLI::App& app, PlanArgs& args);
int RunPlanCommand(const PlanArgs& args, std::ostream& out, std::ostream& err);

}  // namespace hkv::cli
