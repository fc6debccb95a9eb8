// hkv: the hybridkv command-line tool.
#include <iostream>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <hkv/common/version.h>

#include "plan_command.h"
#include "simulate_command.h"
#include "sparse_eval_command.h"
#include "tier_command.h"
#include "trace_command.h"
#include "verify_command.h"

int main(int argc, char** argv) {
  CLI::App app{"hybridkv: KV-cache memory planning and management for hybrid LLMs", "hkv"};
  app.set_version_flag("--version", "hkv " + std::string(hkv::Version()));
  app.require_subcommand(1);
  hkv::cli::PlanArgs plan_args;
  CLI::App* plan = hkv::cli::AddPlanCommand(app, plan_args);
  hkv::cli::TraceGenArgs trace_args;
  CLI::App* trace_gen = hkv::cli::AddTraceCommand(app, trace_args);
  hkv::cli::SimulateArgs simulate_args;
  CLI::App* simulate = hkv::cli::AddSimulateCommand(app, simulate_args);
  hkv::cli::VerifyArgs verify_args;
  CLI::App* verify = hkv::cli::AddVerifyCommand(app, verify_args);
  hkv::cli::SparseEvalArgs sparse_eval_args;
  CLI::App* sparse_eval = hkv::cli::AddSparseEvalCommand(app, sparse_eval_args);
  hkv::cli::TierArgs tier_args;
  const hkv::cli::TierCommands tier = hkv::cli::AddTierCommand(app, tier_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (plan->parsed()) return hkv::cli::RunPlanCommand(plan_args, std::cout, std::cerr);
  if (trace_gen->parsed()) return hkv::cli::RunTraceGen(trace_args, std::cout, std::cerr);
  if (simulate->parsed()) {
    return hkv::cli::RunSimulate(simulate_args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1);
  }
  if (verify->parsed()) return hkv::cli::RunVerifyCommand(verify_args, std::cout, std::cerr);
  if (sparse_eval->parsed()) {
    return hkv::cli::RunSparseEvalCommand(sparse_eval_args, std::cout, std::cerr);
  }
  if (tier.list->parsed() || tier.drop->parsed()) {
    return hkv::cli::RunTierCommand(tier, tier_args, std::cout, std::cerr);
  }
  return 1;
}
