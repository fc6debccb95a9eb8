#include "plan_command.h"

#include <iterator>
#include <ostream>
#include <string_view>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>
#include <hkv/common/dtype.h>
#include <hkv/manager/allocator_mode.h>
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

Result<std::vector<AllocatorMode>> ParseModes(const std::string& text) {
  if (text == "all") {
    return std::vector<AllocatorMode>(std::begin(kAllAllocatorModes), std::end(kAllAllocatorModes));
  }
  Result<AllocatorMode> mode = ParseAllocatorMode(text);
  if (!mode.ok()) {
    return Status::InvalidArgument(
        fmt::format("--allocator '{}': expected uniform, padded, hybridkv or all", text));
  }
  return std::vector<AllocatorMode>{*mode};
}

AllocatorFigures FiguresAt(const Allocator& a, const ModelSpec& model, int64_t tokens,
                           int64_t encoder_tokens) {
  return AllocatorFigures{tokens, a.BytesPerSequence(tokens, encoder_tokens),
                          a.Waste(model, tokens, encoder_tokens),
                          a.MaxSequences(tokens, encoder_tokens)};
}

// Every requested mode built with the plan's resolved options, its figures at the planning point
// and at each length (decoder tokens; the planning point's encoder tokens throughout).
Result<std::vector<AllocatorReport>> CompareAllocators(const Plan& plan,
                                                       const std::vector<AllocatorMode>& modes,
                                                       std::vector<int64_t> lengths) {
  const PlanOptions& o = plan.options;
  for (int64_t t : lengths) {
    if (t < 1 || t > o.max_model_len) {
      return Status::InvalidArgument(fmt::format(
          "--lengths {}: expected decoder tokens in [1, max model len {}]", t, o.max_model_len));
    }
  }
  if (lengths.empty()) lengths = {o.seq_tokens};
  std::vector<AllocatorReport> reports;
  for (AllocatorMode mode : modes) {
    AllocatorReport& r = reports.emplace_back();
    r.mode = mode;
    Result<Allocator> a = MakeAllocator(plan.model, mode, o);
    if (!a.ok()) {
      r.error = a.status().message();
      continue;
    }
    r.allocator = std::move(*a);
    r.planning = FiguresAt(*r.allocator, plan.model, o.seq_tokens, o.encoder_tokens);
    for (int64_t t : lengths)
      r.lengths.push_back(FiguresAt(*r.allocator, plan.model, t, o.encoder_tokens));
  }
  return reports;
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
                  "page sizing: auto (one page size when its padding is at most 5% of a sequence, "
                  "else fewest wasted bytes), single (one page size), multi")
      ->capture_default_str();
  cmd->add_flag("--json", args.json, "print one JSON document instead of tables");
  cmd->add_flag("--show-layout", args.show_layout, "list every tensor view of the layout");
  cmd->add_option("--allocator", args.allocator,
                  "also compare allocator modes per sequence: uniform, padded, hybridkv or all");
  cmd->add_option("--lengths", args.lengths,
                  "decoder lengths to compare the allocators at, e.g. 1024,4096,16384 "
                  "(default: --seq-len)")
      ->delimiter(',');
  return cmd;
}

int RunPlanCommand(const PlanArgs& args, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](std::string_view message) {
    err << "hkv plan: error: " << message << "\n";
    return 1;
  };
  std::vector<AllocatorMode> modes;
  if (!args.allocator.empty()) {
    Result<std::vector<AllocatorMode>> parsed = ParseModes(args.allocator);
    if (!parsed.ok()) return fail(parsed.status().message());
    modes = std::move(*parsed);
  } else if (!args.lengths.empty()) {
    return fail("--lengths compares allocators: it needs --allocator");
  }
  Result<Plan> plan = BuildPlan(args);
  if (!plan.ok()) return fail(plan.status().message());
  std::vector<AllocatorReport> reports;
  if (!modes.empty()) {
    Result<std::vector<AllocatorReport>> compared = CompareAllocators(*plan, modes, args.lengths);
    if (!compared.ok()) return fail(compared.status().message());
    reports = std::move(*compared);
  }
  if (args.json) {
    nlohmann::json doc = PlanToJson(*plan);
    if (!modes.empty()) doc["allocators"] = AllocatorsToJson(reports);
    out << doc.dump(2) << "\n";
  } else {
    PrintPlanTable(*plan, args.show_layout, out);
    if (!modes.empty()) PrintAllocatorTable(*plan, reports, !args.lengths.empty(), out);
  }
  for (const std::string& w : plan->warnings)
    err << "hkv plan: warning: " << w << "\n";
  bool any = modes.empty();
  for (const AllocatorReport& r : reports) {
    if (r.allocator) {
      any = true;
    } else {
      err << "hkv plan: " << AllocatorModeName(r.mode) << " cannot hold the model: " << r.error
          << "\n";
    }
  }
  return any ? 0 : 1;
}

}  // namespace hkv::cli
