// `hkv verify CONFIG`: the end-to-end proof on one model (hkv/engine/verify.h).
//
// Contract: AddVerifyCommand registers `verify`; RunVerifyCommand loads CONFIG, runs the
// randomised workload through the engine and the dense reference, prints per-feature counts and
// mismatches (a table, or JSON with --json) to `out`, and returns 0 only when every request
// finished with no mismatch; 1 on a mismatch or an unfinished workload, 2 on bad input. With
// --policy (and --budget) the engine evicts by a sparse-KV policy and every sequence is checked
// against attention masked to what each layer kept. With --offload the engine exports what it
// publishes into a host or disk tier and reloads hits from it (--restarts: fresh engines serve
// later parts of the workload from the same tier).
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

#include <hkv/engine/verify.h>

namespace hkv::cli {

struct VerifyArgs {
  std::string config;
  VerifyOptions options;
  bool json = false;
  // Sparse KV: a policy on every full-attention layer and its budget (docs/policy.md); the run
  // is then checked against the masked reference.
  std::string policy;
  std::string budget;
  // Offload: "host", or "disk" (a fresh directory under the system's temp dir) or "disk:DIR".
  std::string offload;
  // KV events: a ZeroMQ endpoint to publish the run's events on (vLLM's format), and how long to
  // wait for a subscriber first.
  std::string kv_events;
  int kv_events_wait_ms = 0;
};

CLI::App* AddVerifyCommand(CLI::App& app, VerifyArgs& args);
int RunVerifyCommand(const VerifyArgs& args, std::ostream& out, std::ostream& err);

}  // namespace hkv::cli
