// `hkv simulate`: replay a trace through the real manager under one or all allocator modes.
//
// Contract: RunSimulate loads the model, reads the trace (or generates the built-in default:
// kDefaultTraceOptions), runs the replay once per requested allocator — `vllm` (vLLM v1's own
// manager and scheduler rules, ReplayVllm; the baseline) and hkv's modes uniform, padded and
// hybridkv (Replay) — and prints one comparison table (or, with --json, {"runs": [...]} with the
// figures replay.md names, each run's ideal hit rate at its own block size). --csv DIR writes
// one per-step CSV per mode, --requests-csv DIR one requests CSV per mode in the format of
// vLLM's reference script (id, arrival, first scheduled step, first hit tokens, preemptions,
// finish step), --plot FILE a PNG of the modes over time (gnuplot). A progress bar goes
// to `err` only when `err_is_tty`. Returns 0, 1 when a mode could not be replayed (the others are
// still reported), or 2 for bad arguments, an unreadable config or trace, or a failed output.
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>

namespace hkv::cli {

struct SimulateArgs {
  std::string config;
  std::string trace;  // empty: the built-in default trace
  std::string memory = "16GiB";
  int64_t max_model_len = 16384;
  int64_t budget = 8192;
  int32_t max_running = 1024;
  int32_t block_tokens = 16;
  std::string allocator = "all";
  std::string mamba_cache_mode = "auto";  // vllm mode: auto, all or align
  int32_t max_state_splits = 2;           // hkv modes: checkpoints inside one request's chunk
  std::string csv_dir;
  std::string requests_csv_dir;
  std::string plot;
  bool no_compact = false;  // hkv modes: an engine that never moves pages (CompactionDue off)
  bool publish_at_commit = false;   // hkv modes: ManagerConfig::publish_at_allocate off
  bool no_coverage = false;         // hkv modes: ManagerConfig::evict_uncovered off
  bool prompt_checkpoints = false;  // hkv modes: ManagerConfig::prompt_checkpoints on
  int64_t checkpoint_interval = 0;  // hkv modes: ManagerConfig::checkpoint_interval (aligned up)
  int64_t rolling_stride = -1;      // hkv modes: rolling_stride_after_give_back; -1: the mode's
  int32_t branch_memory = -1;       // hkv modes: branch_memory_entries; -1: the mode's
  double branch_bonus = -1;         // hkv modes: ManagerConfig::branch_bonus; -1: the mode's
  std::string thrash_guard;  // hkv modes: "on"/"off" (ManagerConfig::thrash_guard); "": the mode's
  double thrash_keep_share = -1;     // hkv modes: ManagerConfig::thrash_keep_share; -1: the mode's
  int32_t admission_headroom = -1;   // hkv modes: admission_headroom_steps; -1: the mode's
  std::string vllm_policy = "vllm";  // vllm mode: vLLM's eviction order, or "hybridkv"
  bool oracle = false;  // also an `oracle` run (ReplayOptions::oracle), and fractions of it
  bool json = false;
};

// The default trace: 1000 requests of replay.md's generator, seed 7, session gap 150 steps.
TraceGenOptions DefaultSimulateTrace();

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args);
int RunSimulate(const SimulateArgs& args, std::ostream& out, std::ostream& err, bool err_is_tty);

}  // namespace hkv::cli
