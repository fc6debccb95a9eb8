// `hkv tier list DIR` and `hkv tier drop DIR MODEL`: what a disk tier directory holds, per model,
// and removing one model's entries (hkv/connector/disk_tier.h).
//
// Contract: AddTierCommand registers `tier` with `list` and `drop`. RunTierCommand prints, for
// `list`, one line per model (its identity, label, entries, bytes, whether a process holds it) or
// JSON with --json, and returns 0; for `drop`, removes the model's entries and returns 0. Bad
// input (an identity that is not 32 hex digits, a model the directory lacks, one a running process
// holds, an unreadable directory) prints the reason to `err` and returns 2, changing nothing.
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

namespace hkv::cli {

struct TierArgs {
  std::string dir;
  std::string model;  // drop: 32 hex digits, as `list` prints them
  bool json = false;
};

struct TierCommands {
  CLI::App* list = nullptr;
  CLI::App* drop = nullptr;
};

TierCommands AddTierCommand(CLI::App& app, TierArgs& args);
int RunTierCommand(const TierCommands& commands, const TierArgs& args, std::ostream& out,
                   std::ostream& err);

}  // namespace hkv::cli
