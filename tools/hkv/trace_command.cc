#include "trace_command.h"

#include <ostream>

#include <fmt/format.h>

#include <hkv/sim/trace.h>

namespace hkv::cli {

CLI::App* AddTraceCommand(CLI::App& app, TraceGenArgs& args) {
  CLI::App* trace = app.add_subcommand("trace", "Synthetic request traces");
  trace->require_subcommand(1);
  CLI::App* gen = trace->add_subcommand(
      "gen", "Generate a multi-turn chat trace (JSONL, the format of replay.md)");
  TraceGenOptions& o = args.options;
  gen->add_option("--requests", o.num_requests, "number of requests")->capture_default_str();
  gen->add_option("--seed", o.seed, "random seed; the same seed gives the same trace")
      ->capture_default_str();
  gen->add_option("--session-gap", o.session_gap, "mean steps between session starts (Poisson)")
      ->capture_default_str();
  gen->add_option("--max-turns", o.max_turns, "turns per session are uniform in 1..N")
      ->capture_default_str();
  gen->add_option("--system-prompts", o.num_system_prompts, "number of shared system prompts")
      ->capture_default_str();
  gen->add_option("--system-prompt-share", o.system_prompt_share,
                  "fraction of sessions that start with a shared system prompt")
      ->capture_default_str();
  gen->add_option("--max-prompt", o.max_prompt_tokens, "prompt length cap in tokens")
      ->capture_default_str();
  gen->add_option("--vocab", o.vocab_size, "token ids are drawn from [0, N)")
      ->capture_default_str();
  gen->add_option("-o,--output", args.output, "output file (default: standard output)");
  return gen;
}

int RunTraceGen(const TraceGenArgs& args, std::ostream& out, std::ostream& err) {
  Result<Trace> trace = GenerateTrace(args.options);
  if (!trace.ok()) {
    err << "hkv trace gen: error: " << trace.status().message() << "\n";
    return 1;
  }
  if (args.output.empty()) {
    WriteTrace(*trace, out);
  } else if (Status s = WriteTraceFile(*trace, args.output); !s.ok()) {
    err << "hkv trace gen: error: " << s.message() << "\n";
    return 1;
  }
  int64_t prompt_tokens = 0, output_tokens = 0, sessions = 0;
  for (const TraceRequest& q : *trace) {
    prompt_tokens += static_cast<int64_t>(q.prompt.size());
    output_tokens += q.output_len;
    if (q.turn == 0) ++sessions;
  }
  err << fmt::format(
      "hkv trace gen: {} requests, {} sessions, {} prompt tokens, {} output tokens, "
      "last arrival at step {}\n",
      trace->size(), sessions, prompt_tokens, output_tokens,
      trace->empty() ? 0 : trace->back().arrival_step);
  return 0;
}

}  // namespace hkv::cli
