#include "verify_command.h"

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <hkv/connector/disk_tier.h>
#include <hkv/connector/host_tier.h>
#include <hkv/connector/remote_tier.h>
#include <hkv/spec/config_loader.h>

namespace hkv::cli {

CLI::App* AddVerifyCommand(CLI::App& app, VerifyArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "verify", "Run a scaled-down model through the managed cache and compare with dense");
  cmd->add_option("config", args.config, "config.json, or the folder holding it")->required();
  cmd->add_option("--requests", args.options.requests, "requests to submit")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--seed", args.options.seed, "workload and weight seed");
  cmd->add_option("--weights-seed", args.options.weights_seed,
                  "the tiny model's weight seed (default: from --seed); the tiers keep models "
                  "of other weights apart");
  cmd->add_option("--steps", args.options.max_steps, "most scheduler steps")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  cmd->add_option("--memory", args.options.memory_bytes,
                  "KV memory in bytes (default: about three sequences)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  cmd->add_option("--branch-bonus", args.options.branch_bonus,
                  "keep prefixes several requests branch from this many cache turnovers longer "
                  "per extra continuation (ManagerConfig::branch_bonus; default 0: least "
                  "recently freed first)")
      ->check(CLI::Range(0.0, 64.0));
  cmd->add_option("--thrash-keep-share", args.options.thrash_keep_share,
                  "turn the thrash guard on (ManagerConfig::thrash_guard) with this share of "
                  "finished requests' chains keeping their place, the rest on probation; 0: the "
                  "share is learned (default: guard off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--thrash-guard", args.options.thrash_guard,
                "the thrash guard on, its share learned (ManagerConfig::thrash_guard)");
  cmd->add_option("--admission-headroom", args.options.admission_headroom_steps,
                  "admit a request only if the running ones could still decode this many more "
                  "steps in what stays free (ManagerConfig::admission_headroom_steps; default 0)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--policy", args.policy,
                  "sparse-KV policy on every full-attention layer: dense, streaming_llm, h2o, "
                  "tova, snapkv, knorm");
  cmd->add_option("--budget", args.budget,
                  "the policy's budget: tokens (16), a fraction (0.25) or a percentage (25%); "
                  "default: the whole sequence");
  cmd->add_option("--offload", args.offload,
                  "export published blocks into a tier and reload hits from it: host, disk "
                  "(a new temp directory), disk:DIR, redis:HOST:PORT or redis:unix:SOCKET (a "
                  "running Redis/Valkey server; HKV_REDIS_USER, HKV_REDIS_PASSWORD and "
                  "HKV_TIER_SECRET from the environment)");
  cmd->add_option("--restarts", args.options.restarts,
                  "with --offload: fresh engines (empty cache, same tier) serve this many later "
                  "parts of the workload")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--kv-events", args.kv_events,
                  "publish every KV-cache event in vLLM's format on this ZeroMQ endpoint "
                  "(e.g. tcp://127.0.0.1:5557)");
  cmd->add_option("--kv-events-wait-ms", args.kv_events_wait_ms,
                  "with --kv-events: wait this long for a subscriber before the run")
      ->check(CLI::Range(0, 600000));
  cmd->add_flag("--json", args.json, "print JSON");
  return cmd;
}

namespace {

// --policy and --budget into options.sparse; false (after saying why) when either is invalid.
bool ParseSparse(const VerifyArgs& args, VerifyOptions& options, std::ostream& err) {
  if (args.policy.empty() && args.budget.empty()) return true;
  SparseKvOptions sparse;
  const Result<PolicyKind> kind = ParsePolicyKind(args.policy.empty() ? "dense" : args.policy);
  if (!kind.ok()) {
    err << "hkv verify: --policy: " << kind.status().ToString() << "\n";
    return false;
  }
  sparse.policy.kind = *kind;
  if (!args.budget.empty()) {
    const Result<PolicyBudget> budget = ParsePolicyBudget(args.budget);
    if (!budget.ok()) {
      err << "hkv verify: --budget: " << budget.status().ToString() << "\n";
      return false;
    }
    sparse.budget = *budget;
  }
  options.sparse = sparse;
  return true;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// redis:HOST:PORT (an unreadable port is 0) or redis:unix:PATH; credentials and the signing
// secret from the environment, where other users' `ps` cannot read them.
RemoteTierOptions RedisOptions(const std::string& offload, int64_t capacity_bytes) {
  const std::string where = offload.substr(6);
  const size_t colon = where.rfind(':');
  RemoteTierOptions ro;
  ro.username = Env("HKV_REDIS_USER");
  ro.password = Env("HKV_REDIS_PASSWORD");
  ro.secret = Env("HKV_TIER_SECRET");
  ro.host = colon == std::string::npos ? where : where.substr(0, colon);
  ro.port = 0;
  if (where.starts_with("unix:")) {
    ro.unix_socket = where.substr(5);
  } else if (colon != std::string::npos) {
    try {
      ro.port = std::stoi(where.substr(colon + 1));
    } catch (const std::exception&) {
      ro.port = 0;
    }
  }
  // A namespace of its own unless told to share one (HKV_REDIS_NAMESPACE): runs that share it and
  // serve the same model (its identity is in every key) load each other's blocks.
  ro.name_space = Env("HKV_REDIS_NAMESPACE");
  if (ro.name_space.empty()) ro.name_space = fmt::format("hkv-verify-{}", ::getpid());
  ro.capacity_bytes = capacity_bytes;
  return ro;
}

// The --offload tier into `tier` (a disk tier without a directory gets a new temp_dir); false
// (after saying why) when it cannot be opened.
bool OpenTier(const std::string& offload, const ModelIdentity& model, const std::string& label,
              std::unique_ptr<Tier>& tier, std::filesystem::path& temp_dir, std::ostream& err) {
  constexpr int64_t kTierBytes = int64_t{1} << 30;
  if (offload == "host") {
    tier = std::make_unique<HostTier>(kTierBytes);
  } else if (offload == "disk" || offload.starts_with("disk:")) {
    std::filesystem::path dir = offload.size() > 5 ? offload.substr(5) : "";
    if (dir.empty()) {
      temp_dir =
          std::filesystem::temp_directory_path() / fmt::format("hkv-verify-disk-{}", ::getpid());
      dir = temp_dir;
    }
    DiskTierOptions o;
    o.capacity_bytes = kTierBytes;
    o.model = model;
    o.label = label;
    auto disk = DiskTier::Open(dir, o);
    if (!disk.ok()) {
      err << "hkv verify: --offload: " << disk.status().ToString() << "\n";
      return false;
    }
    tier = std::make_unique<DiskTier>(std::move(disk).value());
  } else if (offload.starts_with("redis:")) {
    RemoteTierOptions ro = RedisOptions(offload, kTierBytes);
    ro.model = model;
    auto remote = RemoteTier::Connect(ro);
    if (!remote.ok()) {
      err << "hkv verify: --offload: " << remote.status().ToString() << "\n";
      return false;
    }
    tier = std::move(remote).value();
  } else {
    err << "hkv verify: --offload: unknown tier '" << offload
        << "'; expected host, disk, disk:DIR, redis:HOST:PORT or redis:unix:SOCKET\n";
    return false;
  }
  return true;
}

void PrintJson(const VerifyArgs& args, const VerifyOptions& options, const VerifyReport& r,
               const Tier* tier, std::ostream& out) {
  const EngineCounters& f = r.features;
  nlohmann::json j;
  j["model"] = r.model;
  j["requests"] = r.requests;
  j["steps"] = r.steps;
  j["memory_bytes"] = r.memory_bytes;
  j["completed"] = r.completed;
  j["mismatches"] = r.mismatches;
  j["dense_mismatches"] = r.dense_mismatches;
  j["max_logit_diff"] = r.max_logit_diff;
  j["padded_block_tokens"] = r.padded_block_tokens;
  j["slabs_reclaimed"] = r.slabs_reclaimed;
  j["features"] = {{"prefix_hit_tokens", f.prefix_hit_tokens},
                   {"preemptions", f.preemptions},
                   {"forks", f.forks},
                   {"truncations", f.truncations},
                   {"checkpoint_hits", f.checkpoint_hits},
                   {"shortest_checkpoint_hit", f.shortest_checkpoint_hit},
                   {"window_blocks_freed", f.window_blocks_freed},
                   {"state_splits", f.state_splits},
                   {"max_state_splits", f.max_state_splits},
                   {"cross_attention_reuses", f.cross_attention_reuses},
                   {"drafts_accepted", f.drafts_accepted},
                   {"drafts_rejected", f.drafts_rejected},
                   {"compactions", f.compactions},
                   {"pages_moved", f.pages_moved},
                   {"slabs_compacted", f.slabs_compacted},
                   {"compactions_for_states", f.compactions_for_states},
                   {"compactions_for_cache", f.compactions_for_cache},
                   {"cached_pages_moved", f.cached_pages_moved},
                   {"evictions", f.evictions},
                   {"tokens_evicted", f.tokens_evicted},
                   {"blocks_evicted", f.blocks_evicted},
                   {"evictions_deferred", f.evictions_deferred},
                   {"shared_prefixes_marked", f.shared_prefixes_marked},
                   {"thrash_probation_frees", f.thrash_probation_frees},
                   {"keys_taken_over", f.keys_taken_over},
                   {"admissions_held_for_headroom", f.admissions_held_for_headroom}};
  if (options.kv_events) j["kv_event_batches"] = r.kv_event_batches;
  if (options.offload) {
    j["offload"] = {{"tier", args.offload},
                    {"engines", r.engines},
                    {"external_hits", r.external_hits},
                    {"loads_completed", r.loads_completed},
                    {"loads_failed", r.loads_failed}};
    if (const auto* disk = dynamic_cast<const DiskTier*>(tier)) {
      // What this process found on disk from earlier ones.
      j["offload"]["entries_at_open"] = disk->open_stats().entries_loaded;
      j["offload"]["model"] = disk->model().Hex();
    }
    if (const auto* remote = dynamic_cast<const RemoteTier*>(tier)) {
      j["offload"]["server_hits"] = remote->hits();
      j["offload"]["server_misses"] = remote->misses();
      j["offload"]["server_errors"] = remote->server_errors();
      j["offload"]["reconnects"] = remote->reconnects();
      j["offload"]["corruptions_detected"] = remote->corruptions_detected();
      j["offload"]["forgeries_refused"] = remote->forgeries_refused();
    }
  }
  out << j.dump(2) << "\n";
}

void PrintText(const VerifyArgs& args, const VerifyOptions& options, const VerifyReport& r,
               std::ostream& out) {
  const EngineCounters& f = r.features;
  out << fmt::format("hkv verify: {} (scaled)\n", r.model);
  out << fmt::format("  requests {}  steps {}  completed {}\n", r.requests, r.steps,
                     r.completed ? "yes" : "no");
  out << fmt::format("  mismatches {}  max logit diff {:.3g}\n", r.mismatches, r.max_logit_diff);
  out << fmt::format(
      "  prefix hit tokens {}  preemptions {}  forks {}  truncations {}\n"
      "  checkpoint hits {}  window blocks freed {}  cross-attention reuses {}\n"
      "  drafts accepted {}  rejected {}\n"
      "  slabs reclaimed {}  compactions {}  pages moved {}  slabs compacted {}\n",
      f.prefix_hit_tokens, f.preemptions, f.forks, f.truncations, f.checkpoint_hits,
      f.window_blocks_freed, f.cross_attention_reuses, f.drafts_accepted, f.drafts_rejected,
      r.slabs_reclaimed, f.compactions, f.pages_moved, f.slabs_compacted);
  if (options.sparse) {
    out << fmt::format(
        "  policy {}: evictions {}  tokens evicted {}  blocks evicted {}  deferred {}\n"
        "  (checked against attention masked to the kept tokens; {} differ from dense)\n",
        PolicyKindName(options.sparse->policy.kind), f.evictions, f.tokens_evicted,
        f.blocks_evicted, f.evictions_deferred, r.dense_mismatches);
  }
  if (options.kv_events) {
    out << fmt::format("  KV events: {} batches published on {}\n", r.kv_event_batches,
                       args.kv_events);
  }
  if (options.offload) {
    out << fmt::format(
        "  offload to the {} tier: {} engine(s); hits loaded from the tier {}  loads completed "
        "{}  failed {}\n",
        args.offload, r.engines, r.external_hits, r.loads_completed, r.loads_failed);
  }
  if (r.padded_block_tokens > 0) {
    out << fmt::format(
        "  shortest checkpoint hit {} tokens (a padded allocator's block: {} tokens)\n",
        f.shortest_checkpoint_hit, r.padded_block_tokens);
  }
}

}  // namespace

int RunVerifyCommand(const VerifyArgs& args, std::ostream& out, std::ostream& err) {
  const LoadOptions fp32{DType::kFP32, DType::kFP32, DType::kFP32};
  auto model = LoadModelConfig(args.config, fp32);
  if (!model.ok()) {
    err << "hkv verify: " << model.status().ToString() << "\n";
    return 2;
  }
  VerifyOptions options = args.options;
  if (!ParseSparse(args, options, err)) return 2;
  if (options.thrash_keep_share > 0) options.thrash_guard = true;
  std::unique_ptr<Tier> tier;
  std::filesystem::path temp_dir;
  if (!args.offload.empty()) {
    const Result<ModelIdentity> identity = VerifyModelIdentity(*model, options);
    if (!identity.ok()) {
      err << "hkv verify: " << identity.status().ToString() << "\n";
      return 2;
    }
    const std::string label = fmt::format("{} (hkv verify, weight seed {})", model->model_type,
                                          VerifyWeightsSeed(options));
    if (!OpenTier(args.offload, *identity, label, tier, temp_dir, err)) return 2;
    options.offload = OffloadOptions{{tier.get()}};
  } else if (options.restarts > 0) {
    err << "hkv verify: --restarts needs --offload (a fresh engine without a tier starts empty)\n";
    return 2;
  }
  if (!args.kv_events.empty()) {
    KvEventPublisherOptions ko;
    ko.endpoint = args.kv_events;
    options.kv_events = ko;
    options.kv_events_wait_ms = args.kv_events_wait_ms;
  }
  auto report = RunVerify(*model, options);
  if (!temp_dir.empty()) {
    tier.reset();
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir, ignored);
  }
  if (!report.ok()) {
    err << "hkv verify: " << report.status().ToString() << "\n";
    return 2;
  }
  const VerifyReport& r = *report;
  if (args.json) {
    PrintJson(args, options, r, tier.get(), out);
  } else {
    PrintText(args, options, r, out);
  }
  return r.mismatches == 0 && r.completed ? 0 : 1;
}

}  // namespace hkv::cli
