// `hkv trace gen`: write a synthetic multi-turn trace (replay.md's generator) as JSONL.
//
// Contract: AddTraceCommand registers `trace` with its `gen` subcommand; RunTraceGen writes the
// trace to the -o file (or `out` when none is given) and a one-line summary to `err`, returning 0,
// or 1 with a message naming the bad option.
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

#include <hkv/sim/trace_generator.h>

namespace hkv::cli {

struct TraceGenArgs {
  TraceGenOptions options;
  std::string output;  // empty: standard output
};

// Returns the `gen` subcommand (the caller checks parsed() on it).
CLI::App* AddTraceCommand(CLI::App& app, TraceGenArgs& args);
int RunTraceGen(const TraceGenArgs& args, std::ostream& out, std::ostream& err);

}  // namespace hkv::cli
