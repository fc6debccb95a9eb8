#include "simulate_command.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hkv/common/byte_size.h>
#include <hkv/manager/allocator_mode.h>
#include <hkv/sim/trace.h>
#include <hkv/spec/config_loader.h>
#include <hkv/vllm/kv_cache_config.h>

#include "simulate_output.h"

namespace hkv::cli {
namespace {

// One allocator's replay: `vllm` or one of hkv's AllocatorModes.
struct Run {
  std::string name;
  std::optional<AllocatorMode> mode;  // empty: vllm
  bool oracle = false;                // hybridkv's layout, evicting by the trace's future
  int32_t block_tokens = 0;           // hit granularity (vllm: the scheduler block)
  int64_t state_page_bytes = 0;
  std::vector<int64_t> pool_block_bytes;
  std::string summary;
  double ideal = 0;
  std::optional<ReplayReport> report;
  std::string error;
};

struct Inputs {
  ModelSpec model;
  Trace trace;
  std::string trace_name;
  PlanOptions alloc;  // for MakeAllocator
  vllm::KvCacheOptions vllm;
  ReplayOptions replay;
  bool with_vllm = false;
  std::vector<AllocatorMode> modes;
};

Result<Inputs> Prepare(const SimulateArgs& args) {
  Inputs in;
  HKV_ASSIGN_OR_RETURN(in.alloc.memory_bytes, ParseByteSize(args.memory));
  if (args.block_tokens < 1 || args.block_tokens > (1 << 16)) {
    return Status::InvalidArgument(
        fmt::format("--block-tokens {}: expected 1 to {}", args.block_tokens, 1 << 16));
  }
  in.alloc.block_tokens = args.block_tokens;
  in.alloc.max_model_len = args.max_model_len;
  in.replay.token_budget = args.budget;
  in.replay.max_running = args.max_running;
  in.replay.max_model_len = args.max_model_len;
  in.replay.record_steps = !args.csv_dir.empty() || !args.plot.empty();
  in.replay.record_requests = !args.requests_csv_dir.empty();
  in.replay.compact = !args.no_compact;
  in.replay.publish_at_allocate = !args.publish_at_commit;
  in.vllm.memory_bytes = in.alloc.memory_bytes;
  in.vllm.block_size = args.block_tokens;
  in.vllm.max_model_len = args.max_model_len;
  in.vllm.max_num_batched_tokens = args.budget;
  HKV_ASSIGN_OR_RETURN(in.vllm.mamba_cache_mode, vllm::ParseMambaCacheMode(args.mamba_cache_mode));
  if (args.vllm_policy == "hybridkv") {
    in.replay.vllm_policy = vllm::EvictionPolicy::kHybridKV;
  } else if (args.vllm_policy != "vllm") {
    return Status::InvalidArgument(
        fmt::format("--vllm-policy '{}': expected vllm or hybridkv", args.vllm_policy));
  }
  if (args.allocator == "all") {
    in.with_vllm = true;
    in.modes.assign(std::begin(kAllAllocatorModes), std::end(kAllAllocatorModes));
  } else if (args.allocator == "vllm") {
    in.with_vllm = true;
  } else {
    Result<AllocatorMode> m = ParseAllocatorMode(args.allocator);
    if (!m.ok()) {
      return Status::InvalidArgument(fmt::format(
          "--allocator '{}': expected vllm, uniform, padded, hybridkv or all", args.allocator));
    }
    in.modes = {*m};
  }
  HKV_ASSIGN_OR_RETURN(in.model, LoadModelConfig(args.config));
  if (args.trace.empty()) {
    const TraceGenOptions o = DefaultSimulateTrace();
    HKV_ASSIGN_OR_RETURN(in.trace, GenerateTrace(o));
    in.trace_name = fmt::format("built-in (seed {}, session gap {})", o.seed, o.session_gap);
  } else {
    HKV_ASSIGN_OR_RETURN(in.trace, ReadTrace(args.trace));
    in.trace_name = args.trace;
  }
  if (in.trace.empty()) return Status::InvalidArgument("the trace holds no request");
  // hybridkv splits memory between page classes for the trace's mean request length.
  int64_t tokens = 0;
  for (const TraceRequest& r : in.trace)
    tokens += static_cast<int64_t>(r.prompt.size()) + r.output_len;
  in.alloc.seq_tokens = std::clamp<int64_t>(tokens / static_cast<int64_t>(in.trace.size()), 1,
                                            std::max<int64_t>(args.max_model_len, 1));
  return in;
}

nlohmann::json RunJson(const Run& run, bool with_timings) {
  nlohmann::json j;
  j["allocator"] = run.name;
  if (!run.report) {
    j["error"] = run.error;
    return j;
  }
  const ReplayReport& r = *run.report;
  j["steps"] = r.steps;
  j["preemptions"] = r.preemptions;
  j["hit_rate"] = r.hit_rate();
  j["hit_rate_incl_readmissions"] = r.hit_rate_incl_readmissions();
  j["peak_blocks_used"] = r.peak_blocks_used;
  j["peak_running"] = r.peak_running;
  j["scheduled_tokens"] = r.scheduled_tokens;
  j["compaction"] = {{"compactions", r.compactions},
                     {"pages_moved", r.pages_moved},
                     {"slabs_compacted", r.slabs_compacted},
                     {"cached_pages_moved", r.cached_pages_moved}};
  if (!run.mode) {
    j["block_id_digest"] = r.block_id_digest;
  } else {
    const ManagerStats& m = r.manager_stats;
    j["manager"] = {{"lookups", m.lookups},
                    {"hit_tokens", m.hit_tokens},
                    {"allocations_failed", m.allocations_failed},
                    {"branch_blocks_given_back", m.branch_blocks_given_back},
                    {"remembered_branches_kept", m.remembered_branches_kept},
                    {"shared_prefixes_marked", m.shared_prefixes_marked},
                    {"thrash_keep_share", m.thrash_keep_share},
                    {"thrash_returns_seen", m.thrash_returns_seen},
                    {"thrash_probation_frees", m.thrash_probation_frees},
                    {"keys_taken_over", m.keys_taken_over},
                    {"admissions_held_for_headroom", m.admissions_held_for_headroom},
                    {"rolling_states_given_back", m.rolling_states_given_back},
                    {"uncovered_blocks_demoted", m.uncovered_blocks_demoted},
                    {"unreachable_checkpoints_demoted", m.unreachable_checkpoints_demoted},
                    {"superseded_hits_demoted", m.superseded_hits_demoted}};
  }
  j["state_splits"] = {{"per_step", r.state_splits_per_step()},
                       {"max_step", r.max_step_state_splits},
                       {"max_request", r.max_request_state_splits}};
  j["num_blocks"] = r.num_blocks;
  j["block_tokens"] = run.block_tokens;
  j["state_page_bytes"] = run.state_page_bytes;
  j["pool_block_bytes"] = run.pool_block_bytes;
  j["ideal_hit_rate"] = run.ideal;
  if (with_timings) {
    const StepTimes t = r.manager_times();
    j["manager_us_per_step"] = {{"mean", t.mean}, {"p50", t.p50}, {"p99", t.p99}};
  }
  return j;
}

// The oracle run's hit rate, when there is one that succeeded: every run is also reported as a
// fraction of it.
std::optional<double> OracleHitRate(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    if (run.oracle && run.report) return run.report->hit_rate();
  }
  return std::nullopt;
}

std::string OracleFraction(const Run& run, std::optional<double> oracle) {
  if (!oracle || !run.report) return "";
  return *oracle > 0 ? fmt::format(" {:>9.3f}", run.report->hit_rate() / *oracle)
                     : fmt::format(" {:>9}", "-");
}

void PrintTable(const Inputs& in, const SimulateArgs& args, const std::vector<Run>& runs,
                std::ostream& out) {
  const std::optional<double> oracle = OracleHitRate(runs);
  out << fmt::format("hkv simulate: {} | memory {} | trace {} ({} requests)\n", in.model.source,
                     FormatBytes(in.alloc.memory_bytes), in.trace_name, in.trace.size());
  out << fmt::format(
      "  budget {} tokens/step, max running {}, max model len {}, block {} tokens\n\n", args.budget,
      args.max_running, args.max_model_len, args.block_tokens);
  out << fmt::format(
      "{:<9} {:>6} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>9} {:>8} {:>11} {:>11} {:>20}{}\n",
      "allocator", "block", "blocks", "steps", "preempt", "hit", "hit+re", "ideal", "peak blk",
      "peak run", "sched tok", "splits/step", "mgr us/step mean/p50/p99",
      oracle ? fmt::format(" {:>9}", "of oracle") : "");
  for (const Run& run : runs) {
    if (!run.report) {
      out << fmt::format("{:<9} n/a: {}\n", run.name, run.error);
      continue;
    }
    const ReplayReport& r = *run.report;
    const StepTimes t = r.manager_times();
    out << fmt::format(
        "{:<9} {:>6} {:>8} {:>8} {:>8} {:>7.4f} {:>7.4f} {:>7.4f} {:>9} {:>8} {:>11} {:>11} "
        "{:>20}{}\n",
        run.name, run.block_tokens, r.num_blocks, r.steps, r.preemptions, r.hit_rate(),
        r.hit_rate_incl_readmissions(), run.ideal, r.peak_blocks_used, r.peak_running,
        r.scheduled_tokens,
        fmt::format("{:.3f}/{}", r.state_splits_per_step(), r.max_request_state_splits),
        fmt::format("{:.1f}/{:.1f}/{:.1f}", t.mean, t.p50, t.p99), OracleFraction(run, oracle));
  }
  out << "\n";
  for (const Run& run : runs) {
    if (!run.summary.empty()) out << fmt::format("  {:<9} {}\n", run.name, run.summary);
  }
}

Status WriteRequestsCsv(const std::filesystem::path& dir, const std::vector<Run>& runs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError(fmt::format("{}: {}", dir.string(), ec.message()));
  for (const Run& run : runs) {
    if (!run.report) continue;
    const std::filesystem::path path = dir / (run.name + "_requests.csv");
    std::ofstream f(path);
    f << "id,arrival_step,first_sched_step,first_hit_tokens,num_preemptions,finish_step\n";
    for (const RequestRecord& q : run.report->requests) {
      f << fmt::format("{},{},{},{},{},{}\n", q.id, q.arrival_step, q.first_scheduled_step,
                       q.first_hit_tokens, q.preemptions, q.finish_step);
    }
    if (!f) return Status::IoError(fmt::format("{}: write failed", path.string()));
  }
  return Status::Ok();
}

// Redraws one run's progress bar on the terminal.
std::function<void(int64_t)> ProgressBar(std::ostream& err, int64_t total, std::string name) {
  return [&err, total, name](int64_t done) {
    const int64_t width = 40, filled = total == 0 ? width : done * width / total;
    err << fmt::format("\r{:<9} [{:<40}] {}/{} requests", name,
                       std::string(static_cast<size_t>(filled), '#'), done, total)
        << std::flush;
  };
}

// Replays the trace under run.mode's allocator (empty: vLLM's); false when that failed, with
// run.error saying why.
bool SimulateRun(const Inputs& in, const SimulateArgs& args, Run& run, std::ostream& err,
                 bool err_is_tty) {
  const std::optional<AllocatorMode>& mode = run.mode;
  std::optional<Allocator> allocator;
  std::optional<vllm::KvCacheConfig> vllm_config;
  if (mode) {
    Result<Allocator> a = MakeAllocator(in.model, *mode, in.alloc);
    if (!a.ok()) {
      run.error = a.status().message();
      return false;
    }
    allocator = std::move(*a);
    allocator->config.max_state_splits = args.max_state_splits;
    allocator->config.evict_uncovered = !args.no_coverage;
    allocator->config.prompt_checkpoints = args.prompt_checkpoints;
    if (args.checkpoint_interval > 0) {
      allocator->config.checkpoint_interval = allocator->config.AlignUp(args.checkpoint_interval);
    }
    if (args.rolling_stride >= 0) {
      allocator->config.rolling_stride_after_give_back =
          allocator->config.AlignUp(args.rolling_stride);
    }
    if (args.branch_memory >= 0) allocator->config.branch_memory_entries = args.branch_memory;
    if (args.branch_bonus >= 0) allocator->config.branch_bonus = args.branch_bonus;
    if (!args.thrash_guard.empty()) allocator->config.thrash_guard = args.thrash_guard == "on";
    if (args.thrash_keep_share >= 0) allocator->config.thrash_keep_share = args.thrash_keep_share;
    if (args.admission_headroom >= 0) {
      allocator->config.admission_headroom_steps = args.admission_headroom;
    }
    run.block_tokens = allocator->block_tokens;
    run.state_page_bytes = allocator->state_page_bytes;
    run.pool_block_bytes = allocator->pool_block_bytes;
    run.summary = allocator->summary;
  } else {
    Result<vllm::KvCacheConfig> c = vllm::MakeKvCacheConfig(in.model, in.vllm);
    if (!c.ok()) {
      run.error = c.status().message();
      return false;
    }
    vllm_config = std::move(*c);
    run.block_tokens = vllm_config->scheduler_block_size;
    run.pool_block_bytes = {vllm_config->page_size_bytes * vllm_config->group_size};
    run.summary =
        fmt::format("vLLM v1: {} (mamba cache mode {})", vllm::DescribeGroups(*vllm_config),
                    vllm::MambaCacheModeName(vllm_config->mamba_cache_mode));
  }
  run.ideal = IdealHitRate(in.trace, run.block_tokens);
  ReplayOptions ro = in.replay;
  ro.oracle = run.oracle;
  if (err_is_tty) {
    ro.on_progress = ProgressBar(err, static_cast<int64_t>(in.trace.size()), run.name);
  }
  Result<ReplayReport> r =
      allocator ? Replay(in.trace, allocator->config, ro) : ReplayVllm(in.trace, *vllm_config, ro);
  if (err_is_tty) err << "\r" << std::string(80, ' ') << "\r" << std::flush;
  if (!r.ok()) {
    run.error = r.status().message();
    return false;
  }
  run.report = std::move(*r);
  return true;
}

void PrintJson(const Inputs& in, const std::vector<Run>& runs, std::ostream& out) {
  nlohmann::json j;
  j["model"] = in.model.source;
  j["trace"] = in.trace_name;
  j["requests"] = in.trace.size();
  j["memory_bytes"] = in.alloc.memory_bytes;
  j["runs"] = nlohmann::json::array();
  const std::optional<double> oracle = OracleHitRate(runs);
  for (const Run& run : runs) {
    nlohmann::json r = RunJson(run, true);
    if (oracle && run.report && *oracle > 0) r["of_oracle"] = run.report->hit_rate() / *oracle;
    j["runs"].push_back(std::move(r));
  }
  out << j.dump(2) << "\n";
}

// The files the options ask for: step CSVs, request CSVs, the plot. Whether all were written.
bool WriteFiles(const Inputs& in, const SimulateArgs& args, const std::vector<Run>& runs,
                std::ostream& err) {
  std::vector<StepSeries> series;
  for (const Run& run : runs) {
    if (run.report) series.push_back({run.name, &run.report->log});
  }
  if (!args.csv_dir.empty()) {
    if (Status s = WriteStepCsv(args.csv_dir, series); !s.ok()) {
      err << "hkv simulate: error: " << s.message() << "\n";
      return false;
    }
  }
  if (!args.requests_csv_dir.empty()) {
    if (Status s = WriteRequestsCsv(args.requests_csv_dir, runs); !s.ok()) {
      err << "hkv simulate: error: " << s.message() << "\n";
      return false;
    }
  }
  if (!args.plot.empty()) {
    const std::string title = fmt::format("{}, {}, {} requests", in.model.source,
                                          FormatBytes(in.alloc.memory_bytes), in.trace.size());
    if (Status s = WritePlot(args.plot, title, series); !s.ok()) {
      err << "hkv simulate: error: " << s.message() << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace

TraceGenOptions DefaultSimulateTrace() {
  TraceGenOptions o;
  o.num_requests = 1000;
  o.seed = 7;
  // Moderate load: Gemma-2-9B at 16 GiB keeps up with the arrivals (a heavier trace measures
  // queueing more than caching: later turns arrive before earlier ones are served).
  o.session_gap = 150;
  return o;
}

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Replay a request trace through the manager under each allocator mode");
  cmd->add_option("config", args.config, "config.json of the model, or the folder holding it")
      ->required();
  cmd->add_option(
      "--trace", args.trace,
      "trace (JSONL, replay.md); default: built-in, 1000 requests, seed 7, session gap 150");
  cmd->add_option("--memory", args.memory, "KV memory, e.g. 16GiB")->capture_default_str();
  cmd->add_option("--max-model-len", args.max_model_len, "most tokens per request")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  cmd->add_option("--budget", args.budget, "token budget per step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--max-running", args.max_running, "most running requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--block-tokens", args.block_tokens, "tokens per attention block")
      ->capture_default_str();
  cmd->add_option("--allocator", args.allocator,
                  "vllm (vLLM v1's manager: the baseline), uniform, padded, hybridkv or all")
      ->capture_default_str();
  cmd->add_option("--mamba-cache-mode", args.mamba_cache_mode,
                  "vllm mode on recurrent hybrids: auto (vLLM's default), all or align")
      ->capture_default_str();
  cmd->add_option("--max-state-splits", args.max_state_splits,
                  "hkv modes: recurrent checkpoints inside one request's prefill chunk per step")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--csv", args.csv_dir, "write DIR/<allocator>.csv, one row per step");
  cmd->add_option(
      "--requests-csv", args.requests_csv_dir,
      "write DIR/<allocator>_requests.csv, one row per request (vLLM reference format)");
  cmd->add_option("--plot", args.plot, "write a PNG of the modes over time (gnuplot)");
  cmd->add_flag("--no-compact", args.no_compact,
                "hkv modes with two-level memory: never compact (an engine that does not move "
                "pages); by default they compact as the reference engine does");
  cmd->add_flag("--publish-at-commit", args.publish_at_commit,
                "hkv modes: publish a step's blocks when it is committed, not when it is allocated "
                "(an engine that runs its requests one after another; by default a request "
                "admitted in a step hits what an earlier one computes in it, as in vLLM)");
  cmd->add_option("--vllm-policy", args.vllm_policy,
                  "vllm mode: which free block vLLM's manager evicts next: vllm (its own order) "
                  "or hybridkv (blocks without identity and superseded recurrent states first; "
                  "docs/vllm.md)")
      ->capture_default_str();
  cmd->add_flag("--no-coverage", args.no_coverage,
                "hkv modes on recurrent hybrids: evict attention pages and checkpoints each by its "
                "own recency (ManagerConfig::evict_uncovered off)");
  cmd->add_flag("--prompt-checkpoints", args.prompt_checkpoints,
                "hkv modes on recurrent hybrids: also checkpoint every prompt's end (what an "
                "identical prompt would hit; ManagerConfig::prompt_checkpoints); by default "
                "states are admitted only where prefixes branch and where requests end");
  cmd->add_option("--checkpoint-interval", args.checkpoint_interval,
                  "hkv modes on recurrent hybrids: also checkpoint the state every this many "
                  "tokens of a request (rounded up to the mode's hit alignment), so that a prefix "
                  "other requests branch from later is hit up to the last one before the branch "
                  "(ManagerConfig::checkpoint_interval; 0: none, the default)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--rolling-stride", args.rolling_stride,
                  "hkv modes on recurrent hybrids: once a request gave its rolling state back "
                  "under pressure, keep its next ones only every this many tokens (rounded up to "
                  "the mode's hit alignment; 0: at every aligned position; default: the mode's, "
                  "4096)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--branch-memory", args.branch_memory,
                  "hkv modes on window models with one pool: how many branch points (shared "
                  "prefixes such as system prompts) to remember after their blocks are evicted, "
                  "so that the next request computing one keeps its window for the requests "
                  "after it (ManagerConfig::branch_memory_entries; 0: off; default 1024)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--branch-bonus", args.branch_bonus,
                  "hkv modes: keep a prefix that several continuations share (a system prompt "
                  "sessions branch from) this many cache turnovers longer per extra continuation "
                  "(ManagerConfig::branch_bonus; 0: least recently freed first; default 0.5)")
      ->check(CLI::Range(0.0, 64.0));
  cmd->add_option("--thrash-guard", args.thrash_guard,
                  "hkv modes: keep only the share of finished requests' chains that the measured "
                  "return times say a cache this size can hold until their next turn, the rest "
                  "on probation (ManagerConfig::thrash_guard; default on in uniform and "
                  "hybridkv, off in padded)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--thrash-keep-share", args.thrash_keep_share,
                  "hkv modes with the thrash guard on: keep this fixed share of finished "
                  "requests' chains instead of the learned one (ManagerConfig::thrash_keep_share; "
                  "0: learned)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--admission-headroom", args.admission_headroom,
                  "hkv modes: admit a request only if the running ones could still decode this "
                  "many more steps in what stays free (ManagerConfig::admission_headroom_steps; 0: "
                  "admit whatever fits, as vLLM v1 does; default 32 in uniform and hybridkv, 0 in "
                  "padded)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--oracle", args.oracle,
                "also replay an `oracle` run: hybridkv's layout evicting Belady-style by the "
                "trace's future (the next request that needs a prefix), and show every run's hit "
                "rate as a fraction of it");
  cmd->add_flag("--json", args.json, "print {\"runs\": [...]} instead of a table");
  return cmd;
}

int RunSimulate(const SimulateArgs& args, std::ostream& out, std::ostream& err, bool err_is_tty) {
  Result<Inputs> prepared = Prepare(args);
  if (!prepared.ok()) {
    err << "hkv simulate: error: " << prepared.status().message() << "\n";
    return 2;
  }
  Inputs& in = *prepared;
  std::vector<Run> runs;
  bool failed = false;
  std::vector<std::optional<AllocatorMode>> order;
  if (in.with_vllm) order.push_back(std::nullopt);
  for (AllocatorMode mode : in.modes)
    order.push_back(mode);
  for (const std::optional<AllocatorMode>& mode : order) {
    Run& run = runs.emplace_back();
    run.mode = mode;
    run.name = mode ? std::string(AllocatorModeName(*mode)) : "vllm";
    if (!SimulateRun(in, args, run, err, err_is_tty)) failed = true;
  }
  if (args.oracle) {
    Run& run = runs.emplace_back();
    run.mode = AllocatorMode::kHybridKV;
    run.oracle = true;
    run.name = "oracle";
    if (!SimulateRun(in, args, run, err, err_is_tty)) failed = true;
  }
  if (args.json) {
    PrintJson(in, runs, out);
  } else {
    PrintTable(in, args, runs, out);
  }
  if (!WriteFiles(in, args, runs, err)) return 2;
  for (const Run& run : runs) {
    if (!run.report) {
      err << fmt::format("hkv simulate: {}: {}\n", run.name, run.error);
    }
  }
  return failed ? 1 : 0;
}

}  // namespace hkv::cli
