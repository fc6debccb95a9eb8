#include "plan_command.h"

#include <ostream>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>
#include <hkv/common/dtype.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "plan_report.h"

namespace hkv::cli {
namespace {

// Prefixes a library parse error with the option the text came from.
template <typename T>
Result<T> WithOption(std::string_view option, Result<T> parsed) {
  if (parsed.ok()) return parsed;
  return Status::InvalidArgument(fmt::format("{}: {}", option, parsed.status().message()));
}

Result<Plan> BuildPlan(const PlanArgs& args) {
  LoadOptions load;
  HKV_ASSIGN_OR_RETURN(load.kv_dtype, WithOption("--kv-dtype", ParseDType(args.kv_dtype)));
  HKV_ASSIGN_OR_RETURN(load.state_dtype, WithOption("--state-dtype", ParseDType(args.state_dtype)));
  load.conv_dtype = load.kv_dtype;
  if (!args.conv_dtype.empty()) {
    HKV_ASSIGN_OR_RETURN(load.conv_dtype, WithOption("--conv-dtype", ParseDType(args.conv_dtype)));
  }
  PlanOptions options;
  HKV_ASSIGN_OR_RETURN(options.memory_bytes, WithOption("--memory", ParseByteSize(args.memory)));
  if (args.block_tokens <= 0 || args.block_tokens > (int64_t{1} << 20)) {
    return Status::InvalidArgument(
        fmt::format("--block-tokens {}: expected 1 to {}", args.block_tokens, int64_t{1} << 20));
  }
  options.block_tokens = static_cast<int32_t>(args.block_tokens);
  options.max_model_len = args.max_model_len;
  options.seq_tokens = args.seq_len;
  options.encoder_tokens = args.encoder_tokens;
  HKV_ASSIGN_OR_RETURN(options.layout, WithOption("--layout", ParseTensorLayout(args.layout)));
  HKV_ASSIGN_OR_RETURN(options.strategy,
                       WithOption("--strategy", ParsePageStrategy(args.strategy)));
  HKV_ASSIGN_OR_RETURN(ModelSpec model, LoadModelConfig(args.config, load));
  return MakePlan(model, options);
}

}  // namespace

CLI::App* AddPlanCommand(CLI::App& app, PlanArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "Plan KV-cache memory for a model: groups, pages, layout, capacity and waste");
  cmd->add_option("config", args.config, "config.json of the model, or the folder holding it")
      ->required();
  cmd->add_option("--memory", args.memory, "KV memory budget, e.g. 16GiB, 40GB, 1073741824")
      ->capture_default_str();
  cmd->add_option("--max-model-len", args.max_model_len,
                  "longest sequence to plan for (default: the config's max_position_embeddings)");
  cmd->add_option("--seq-len", args.seq_len,
                  "decoder tokens of the sequence to size (default: --max-model-len)");
  cmd->add_option("--encoder-tokens", args.encoder_tokens,
                  "encoder tokens of the sequence (default: the model's largest encoder input)");
  cmd->add_option("--block-tokens", args.block_tokens, "tokens per attention block")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", args.kv_dtype, "K/V element type: bf16, fp16, fp32, fp8")
      ->capture_default_str();
  cmd->add_option("--state-dtype", args.state_dtype,
                  "recurrent ssm/delta-rule state element type: bf16, fp16, fp32, fp8")
      ->capture_default_str();
  cmd->add_option("--conv-dtype", args.conv_dtype,
                  "recurrent conv state element type (default: --kv-dtype)");
  cmd->add_option("--layout", args.layout, "tensor layout: canonical or per-layer")
      ->capture_default_str();
  cmd->add_option("--strategy", args.strategy,
                  "page sizing: auto (fewest wasted bytes), single (one page size), multi")
      ->capture_default_str();
  cmd->add_flag("--json", args.json, "print one JSON document instead of tables");
  cmd->add_flag("--show-layout", args.show_layout, "list every tensor view of the layout");
  return cmd;
}

int RunPlanCommand(const PlanArgs& args, std::ostream& out, std::ostream& err) {
  Result<Plan> plan = BuildPlan(args);
  if (!plan.ok()) {
    err << "hkv plan: error: " << plan.status().message() << "\n";
    return 1;
  }
  if (args.json) {
    out << PlanToJson(*plan).dump(2) << "\n";
  } else {
    PrintPlanTable(*plan, args.show_layout, out);
  }
  for (const std::string& w : plan->warnings)
    err << "hkv plan: warning: " << w << "\n";
  return 0;
}

}  // namespace hkv::cli
