// `hkv simulate` in process: the comparison table, byte-identical JSON apart from timings, the
// per-step CSV, the plot, and refusals.
#include "simulate_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <hkv/sim/trace.h>
#include <hkv/sim/trace_generator.h>

namespace hkv::cli {
namespace {

namespace fs = std::filesystem;

class SimulateCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("hkv-simulate-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    WriteTrace(80);
    args_.config = std::string(HKV_MODELS_DIR) + "/google--gemma-2-9b";
    args_.trace = (dir_ / "trace.jsonl").string();
    args_.memory = "3GiB";  // tight enough for preemptions and evictions
    // vLLM refuses 3 GiB for one 16384-token Gemma-2 request; 8192 fits (and some prompt +
    // output runs into it).
    args_.max_model_len = 8192;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The replayed trace: `requests` chat requests, seed 5, a session every 20 steps.
  void WriteTrace(int64_t requests, double session_gap = 20) {
    TraceGenOptions o;
    o.num_requests = requests;
    o.seed = 5;
    o.session_gap = session_gap;
    ASSERT_TRUE(WriteTraceFile(GenerateTrace(o).value(), dir_ / "trace.jsonl").ok());
  }

  // One request at a time in the hybridkv mode, as docs/marconi.md replays it, printing JSON.
  void OneAtATime(const char* model, const char* memory) {
    args_.config = std::string(HKV_MODELS_DIR) + "/" + model;
    args_.memory = memory;
    args_.max_running = 1;
    args_.budget = 16384;
    args_.allocator = "hybridkv";
    args_.json = true;
  }

  int Run(std::string& out, std::string& err) {
    std::ostringstream o, e;
    const int rc = RunSimulate(args_, o, e, false);
    out = o.str();
    err = e.str();
    return rc;
  }
  // The first run of `--json` output (one allocator given).
  nlohmann::json FirstRun() {
    std::string out, err;
    EXPECT_EQ(Run(out, err), 0) << err;
    return nlohmann::json::parse(out)["runs"][0];
  }

  fs::path dir_;
  SimulateArgs args_;
};

TEST_F(SimulateCommandTest, JsonIsIdenticalAcrossRunsExceptTimings) {
  args_.json = true;
  std::string a, b, err;
  ASSERT_EQ(Run(a, err), 0) << err;
  ASSERT_EQ(Run(b, err), 0) << err;
  nlohmann::json ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  ASSERT_EQ(ja["runs"].size(), 4u);
  for (auto* j : {&ja, &jb}) {
    for (auto& run : (*j)["runs"]) {
      ASSERT_TRUE(run.contains("manager_us_per_step"));
      for (const char* k : {"mean", "p50", "p99"})
        EXPECT_GE(run["manager_us_per_step"][k].get<double>(), 0.0);
      run.erase("manager_us_per_step");
    }
  }
  EXPECT_EQ(ja.dump(), jb.dump());
  const char* fields[] = {"allocator",
                          "steps",
                          "preemptions",
                          "hit_rate",
                          "hit_rate_incl_readmissions",
                          "peak_blocks_used",
                          "peak_running",
                          "scheduled_tokens",
                          "num_blocks",
                          "block_tokens",
                          "ideal_hit_rate"};
  for (const auto& run : ja["runs"]) {
    for (const char* f : fields)
      EXPECT_TRUE(run.contains(f)) << f;
    EXPECT_GT(run["hit_rate"].get<double>(), 0.0);
    EXPECT_LE(run["hit_rate"].get<double>(), run["ideal_hit_rate"].get<double>());
    EXPECT_LE(run["peak_blocks_used"].get<int64_t>(), run["num_blocks"].get<int64_t>());
  }
  EXPECT_EQ(ja["runs"][0]["allocator"], "vllm");
  EXPECT_EQ(ja["runs"][1]["allocator"], "uniform");
  EXPECT_EQ(ja["runs"][2]["allocator"], "padded");
  EXPECT_EQ(ja["runs"][3]["allocator"], "hybridkv");
  // The memory is tight: the one-pool uniform layout preempts.
  EXPECT_GT(ja["runs"][1]["preemptions"].get<int64_t>(), 0);
  // No recurrent layer: no chunk is split.
  EXPECT_EQ(ja["runs"][3]["state_splits"]["max_request"].get<int64_t>(), 0);
}

// Bamba's states are whole slabs: with attention pages over every slab the replay compacts, as the
// reference engine would, and more prompt tokens hit than in the same replay without page moves.
TEST_F(SimulateCommandTest, CompactsTwoLevelMemoryUnlessTold) {
  // 200 requests arriving every 50 steps: on the fixture's 80, or with its session gap of 20 (so
  // overloaded that few turns find their previous one cached), the few compactions, each dropping
  // the cached pages of the slabs it empties, win back about as many hits as they cost. Under
  // recency alone: with the thrash guard the cache keeps other chains, and on this trace the
  // compactions then drop about as many hits as they win (0.099 against 0.102 without them).
  // Admitting whatever fits: with the admission headroom the state class rarely runs short on
  // this trace, and the compactions it still asks for cost hits (0.105 against 0.110).
  WriteTrace(200, 50);
  args_.config = std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B";
  args_.memory = "2GiB";
  args_.allocator = "hybridkv";
  args_.thrash_guard = "off";
  args_.admission_headroom = 0;
  args_.json = true;
  const auto replay = [&](bool no_compact) {
    args_.no_compact = no_compact;
    return FirstRun();
  };
  const nlohmann::json on = replay(false), off = replay(true);
  EXPECT_GT(on["compaction"]["compactions"].get<int64_t>(), 0);
  EXPECT_GT(on["compaction"]["pages_moved"].get<int64_t>(), 0);
  EXPECT_GT(on["compaction"]["slabs_compacted"].get<int64_t>(), 0);
  EXPECT_EQ(off["compaction"]["pages_moved"].get<int64_t>(), 0);
  EXPECT_GT(on["hit_rate"].get<double>(), off["hit_rate"].get<double>());
  EXPECT_LT(on["scheduled_tokens"].get<int64_t>(), off["scheduled_tokens"].get<int64_t>());
}

// Bamba one request at a time in 2 GiB: checkpoint coverage (the default) evicts a conversation's
// KV and its end state together and demotes the turns a follow-up supersedes; more prompt tokens
// hit than with each page class evicting by its own recency.
TEST_F(SimulateCommandTest, EvictsByCheckpointCoverageUnlessTold) {
  args_.config = std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B";
  args_.memory = "2GiB";
  args_.allocator = "hybridkv";
  args_.max_running = 1;
  args_.json = true;
  const auto replay = [&](bool no_coverage) {
    args_.no_coverage = no_coverage;
    return FirstRun();
  };
  const nlohmann::json on = replay(false), off = replay(true);
  EXPECT_GT(on["hit_rate"].get<double>(), off["hit_rate"].get<double>());
  EXPECT_LT(on["scheduled_tokens"].get<int64_t>(), off["scheduled_tokens"].get<int64_t>());
}

// Bamba in vLLM's layout at 4 GiB: the hybridkv eviction policy keeps the states that later
// requests hit, where vLLM's own order fills memory with states nothing will hit.
TEST_F(SimulateCommandTest, TheVllmModeTakesTheHybridkvEvictionPolicy) {
  args_.config = std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B";
  args_.memory = "4GiB";
  args_.allocator = "vllm";
  args_.json = true;
  const auto replay = [&](const char* policy) {
    args_.vllm_policy = policy;
    return FirstRun();
  };
  const nlohmann::json vllm = replay("vllm"), hybridkv = replay("hybridkv");
  EXPECT_GT(hybridkv["hit_rate"].get<double>(), vllm["hit_rate"].get<double>());
  EXPECT_LT(hybridkv["scheduled_tokens"].get<int64_t>(), vllm["scheduled_tokens"].get<int64_t>());
  args_.vllm_policy = "lru";
  std::string out, err;
  EXPECT_NE(Run(out, err), 0);
  EXPECT_NE(err.find("--vllm-policy 'lru'"), std::string::npos) << err;
}

// Jamba in 0.5 GiB, one request at a time: 61 slabs, each one recurrent state or 33 attention
// pages. The state class used to hold two slabs and lose every checkpoint it published (the
// attention class took its empty slab, and the state class then evicted its checkpoint for its
// own need), so hardly any request hit; the hit rate was 0.028 on this trace. The manager's
// counters come with the JSON.
TEST_F(SimulateCommandTest, JambaKeepsCheckpointsInHalfAGibibyte) {
  WriteTrace(150);
  args_.config = std::string(HKV_MODELS_DIR) + "/ai21labs--Jamba-v0.1";
  args_.memory = "0.5GiB";
  args_.max_model_len = 16384;
  args_.max_running = 1;
  args_.budget = 16384;
  args_.allocator = "hybridkv";
  args_.json = true;
  const nlohmann::json run = FirstRun();
  EXPECT_GT(run["hit_rate"].get<double>(), 0.06);
  ASSERT_TRUE(run.contains("manager"));
  EXPECT_EQ(run["manager"]["lookups"].get<int64_t>(), 150);
  EXPECT_GT(run["manager"]["hit_tokens"].get<int64_t>(), 0);
}

// --oracle adds a run with hybridkv's layout evicting by the trace's future, and reports every
// run's hit rate as a fraction of it. On this tight trace the future is worth something: the
// oracle hits more than recency does in the same memory.
TEST_F(SimulateCommandTest, OracleRunAndEveryRunAsAFractionOfIt) {
  args_.allocator = "hybridkv";
  args_.oracle = true;
  args_.json = true;
  std::string out, err;
  ASSERT_EQ(Run(out, err), 0) << err;
  const nlohmann::json runs = nlohmann::json::parse(out)["runs"];
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["allocator"], "hybridkv");
  EXPECT_EQ(runs[1]["allocator"], "oracle");
  const double lru = runs[0]["hit_rate"].get<double>(), oracle = runs[1]["hit_rate"].get<double>();
  EXPECT_GT(oracle, lru);
  EXPECT_DOUBLE_EQ(runs[0]["of_oracle"].get<double>(), lru / oracle);
  EXPECT_DOUBLE_EQ(runs[1]["of_oracle"].get<double>(), 1.0);
  // The same layout: only the eviction order differs.
  EXPECT_EQ(runs[0]["num_blocks"], runs[1]["num_blocks"]);
  args_.json = false;
  ASSERT_EQ(Run(out, err), 0) << err;
  EXPECT_NE(out.find("of oracle"), std::string::npos) << out;
  EXPECT_NE(out.find("\noracle "), std::string::npos) << out;
  // Without --oracle the table is as before: no such column.
  args_.oracle = false;
  ASSERT_EQ(Run(out, err), 0) << err;
  EXPECT_EQ(out.find("oracle"), std::string::npos) << out;
}

// --rolling-stride: by default a request that gave its rolling state back keeps its next ones
// only every 4096 tokens; 0 keeps one at every aligned position again, which on Bamba in 4 GiB
// gives many more states back (each a second state page taken back a block later). Whether that
// hits more or less depends on the trace (docs/manager.md, "Rolling states under pressure").
// Admitting whatever fits: with the admission headroom nothing is given back on this trace.
TEST_F(SimulateCommandTest, RollingStrideAfterAGiveBack) {
  WriteTrace(200);
  args_.config = std::string(HKV_MODELS_DIR) + "/ibm-ai-platform--Bamba-9B";
  args_.memory = "4GiB";
  args_.max_model_len = 16384;
  args_.allocator = "hybridkv";
  args_.admission_headroom = 0;
  args_.json = true;
  const nlohmann::json strided = FirstRun();
  args_.rolling_stride = 0;
  const nlohmann::json every = FirstRun();
  const auto given_back = [](const nlohmann::json& run) {
    return run["manager"]["rolling_states_given_back"].get<int64_t>();
  };
  EXPECT_GT(given_back(strided), 0);
  EXPECT_GT(given_back(every), 2 * given_back(strided));
}

// --branch-memory: on Gemma-2 (one pool) requests computing a system prompt again keep its
// window for the requests after them, because the manager remembers where prefixes branched;
// 0 turns the memory off.
TEST_F(SimulateCommandTest, BranchMemory) {
  WriteTrace(200);
  args_.allocator = "hybridkv";
  args_.json = true;
  const nlohmann::json remembered = FirstRun();
  args_.branch_memory = 0;
  const nlohmann::json forgotten = FirstRun();
  const auto kept = [](const nlohmann::json& run) {
    return run["manager"]["remembered_branches_kept"].get<int64_t>();
  };
  EXPECT_GT(kept(remembered), 0);
  EXPECT_EQ(kept(forgotten), 0);
  EXPECT_GT(remembered["hit_rate"].get<double>(), forgotten["hit_rate"].get<double>());
}

// --admission-headroom: by default (32 decode steps in hybridkv) an admission waits while the
// running requests could not decode 32 more steps in what would stay free; under this overload
// Llama-3.1-8B in 2 GiB then preempts fewer requests, hits more and computes fewer tokens than
// when admissions take whatever fits (0, as vLLM v1).
TEST_F(SimulateCommandTest, AdmissionHeadroomPreemptsLess) {
  WriteTrace(200);
  args_.config = std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B";
  args_.memory = "2GiB";
  args_.max_model_len = 16384;
  args_.allocator = "hybridkv";
  args_.json = true;
  const nlohmann::json headroom = FirstRun();
  args_.admission_headroom = 0;
  const nlohmann::json all = FirstRun();
  const auto held = [](const nlohmann::json& run) {
    return run["manager"]["admissions_held_for_headroom"].get<int64_t>();
  };
  EXPECT_GT(held(headroom), 0);
  EXPECT_EQ(held(all), 0);
  EXPECT_GT(all["preemptions"].get<int64_t>(), 0);
  EXPECT_LT(headroom["preemptions"].get<int64_t>(), all["preemptions"].get<int64_t>());
  EXPECT_GE(headroom["hit_rate"].get<double>(), all["hit_rate"].get<double>());
  EXPECT_LT(headroom["scheduled_tokens"].get<int64_t>(), all["scheduled_tokens"].get<int64_t>());
}

TEST_F(SimulateCommandTest, BranchBonus) {
  WriteTrace(200);
  args_.allocator = "hybridkv";
  args_.json = true;
  const nlohmann::json shared = FirstRun();  // the mode's bonus
  args_.branch_bonus = 0;
  const nlohmann::json plain = FirstRun();
  const auto marked = [](const nlohmann::json& run) {
    return run["manager"]["shared_prefixes_marked"].get<int64_t>();
  };
  EXPECT_GT(marked(shared), 0);
  EXPECT_EQ(marked(plain), 0);
  EXPECT_NE(shared["scheduled_tokens"].get<int64_t>(), plain["scheduled_tokens"].get<int64_t>());
}

// Bamba one request at a time in 2 GiB, which holds a few conversations: recency evicts each
// before its next turn, the guard learns it and keeps a share, and more follow-ups hit (0.333
// against 0.281). Off, it neither measures nor acts.
TEST_F(SimulateCommandTest, ThrashGuard) {
  WriteTrace(800);
  OneAtATime("ibm-ai-platform--Bamba-9B", "2GiB");
  const nlohmann::json guarded = FirstRun();  // the mode's default: on
  args_.thrash_guard = "off";
  const nlohmann::json plain = FirstRun();
  const auto stat = [](const nlohmann::json& run, const char* name) {
    return run["manager"][name].get<double>();
  };
  EXPECT_GT(stat(guarded, "thrash_returns_seen"), 100);
  EXPECT_LT(stat(guarded, "thrash_keep_share"), 1);
  EXPECT_GT(stat(guarded, "thrash_probation_frees"), 0);
  EXPECT_EQ(stat(plain, "thrash_returns_seen"), 0);
  EXPECT_EQ(stat(plain, "thrash_keep_share"), 1);
  EXPECT_EQ(stat(plain, "thrash_probation_frees"), 0);
  EXPECT_GT(guarded["hit_rate"].get<double>(), plain["hit_rate"].get<double>());
  // A fixed share stays where it was put.
  args_.thrash_guard = "on";
  args_.thrash_keep_share = 0.125;
  const nlohmann::json fixed = FirstRun();
  EXPECT_EQ(stat(fixed, "thrash_keep_share"), 0.125);
  EXPECT_GT(stat(fixed, "thrash_probation_frees"), stat(guarded, "thrash_probation_frees"));
}

// The guard finds the conversations a prompt continues as well at 1-token blocks as at 16: its
// look-back is in tokens (a follow-up message is up to 1500 of them).
TEST_F(SimulateCommandTest, ThrashGuardAtOneTokenBlocks) {
  WriteTrace(800);
  OneAtATime("ibm-ai-platform--Bamba-9B", "2GiB");
  const nlohmann::json sixteen = FirstRun();
  args_.block_tokens = 1;
  const nlohmann::json one = FirstRun();
  const double seen16 = sixteen["manager"]["thrash_returns_seen"].get<double>();
  const double seen1 = one["manager"]["thrash_returns_seen"].get<double>();
  EXPECT_GT(seen16, 100);
  EXPECT_GE(seen1, 0.95 * seen16);
  EXPECT_LT(one["manager"]["thrash_keep_share"].get<double>(), 1);
}

// Interval checkpoints (--checkpoint-interval, with room for them in a step's chunk): the second
// request of a system prompt finds a state at the last interval before the prompt's branch
// instead of computing the whole prompt again.
TEST_F(SimulateCommandTest, CheckpointInterval) {
  WriteTrace(100);
  OneAtATime("ibm-ai-platform--Bamba-9B", "16GiB");
  args_.max_state_splits = 64;
  const nlohmann::json none = FirstRun();
  args_.checkpoint_interval = 250;  // rounded up to 256, a multiple of the 16-token blocks
  const nlohmann::json every = FirstRun();
  EXPECT_GT(every["hit_rate"].get<double>(), none["hit_rate"].get<double>() + 0.005);
  EXPECT_LE(none["state_splits"]["max_request"].get<int64_t>(), 2);
  EXPECT_GT(every["state_splits"]["max_request"].get<int64_t>(), 8);
}

TEST_F(SimulateCommandTest, TableCsvAndPlot) {
  args_.csv_dir = (dir_ / "csv").string();
  args_.plot = (dir_ / "modes.png").string();
  std::string out, err;
  ASSERT_EQ(Run(out, err), 0) << err;
  for (const char* mode : {"vllm", "uniform", "padded", "hybridkv"})
    EXPECT_NE(out.find(std::string("\n") + mode), std::string::npos) << out;
  EXPECT_NE(out.find("ideal"), std::string::npos);
  EXPECT_NE(out.find("vLLM v1: 1 sliding_window group (21 layers, 16-token blocks), 1 "
                     "full_attention group (21 layers"),
            std::string::npos)
      << out;
  // One CSV row per replayed step, in step order.
  args_.csv_dir.clear();
  args_.plot.clear();
  args_.json = true;
  args_.allocator = "hybridkv";
  std::string json;
  ASSERT_EQ(Run(json, err), 0) << err;
  const int64_t steps = nlohmann::json::parse(json)["runs"][0]["steps"].get<int64_t>();
  std::ifstream csv(dir_ / "csv" / "hybridkv.csv");
  std::string line;
  ASSERT_TRUE(std::getline(csv, line));
  EXPECT_EQ(line,
            "step,running,waiting,blocks_used,cached_blocks,hit_tokens,preemptions,"
            "scheduled_tokens");
  int64_t rows = 0, last_step = -1;
  while (std::getline(csv, line)) {
    const int64_t step = std::stoll(line.substr(0, line.find(',')));
    EXPECT_GT(step, last_step);
    last_step = step;
    ++rows;
  }
  EXPECT_EQ(rows, steps);
  std::ifstream png(dir_ / "modes.png", std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST_F(SimulateCommandTest, RefusalsExitTwoAndNameTheProblem) {
  std::string out, err;
  args_.allocator = "bogus";
  EXPECT_EQ(Run(out, err), 2);
  EXPECT_NE(err.find("allocator 'bogus'"), std::string::npos) << err;
  args_.allocator = "vllm";
  args_.mamba_cache_mode = "sometimes";
  EXPECT_EQ(Run(out, err), 2);
  EXPECT_NE(err.find("mamba cache mode 'sometimes'"), std::string::npos) << err;
  args_.mamba_cache_mode = "auto";
  args_.max_model_len = 16384;  // vLLM refuses 3 GiB for it: the run fails, the others report
  args_.allocator = "all";
  EXPECT_EQ(Run(out, err), 1);
  EXPECT_NE(err.find("vLLM refuses to start"), std::string::npos) << err;
  EXPECT_NE(out.find("hybridkv"), std::string::npos) << out;
  args_.max_model_len = 8192;
  args_.allocator = "all";
  args_.trace = (dir_ / "missing.jsonl").string();
  EXPECT_EQ(Run(out, err), 2);
  EXPECT_NE(err.find("missing.jsonl"), std::string::npos) << err;
  args_.trace = (dir_ / "trace.jsonl").string();
  args_.memory = "lots";
  EXPECT_EQ(Run(out, err), 2);
  EXPECT_NE(err.find("lots"), std::string::npos) << err;
  // Memory whose block metadata would not fit in this machine: refused at once, naming the limit
  // (it used to take 6.8 GB at 100 TiB and run until killed at 100000 TiB).
  for (const char* huge : {"100TiB", "100000TiB"}) {
    args_.memory = huge;
    EXPECT_EQ(Run(out, err), 1) << huge;
    EXPECT_NE(err.find("more blocks than the 16777216 a manager may have"), std::string::npos)
        << err;
    EXPECT_NE(err.find("vLLM refuses to start") == std::string::npos ? err.find("one pool may have")
                                                                     : err.find("vLLM refuses"),
              std::string::npos)
        << err;
  }
  // A memory too small for the longest prompt: every mode reports it, exit 1.
  args_.memory = "256MiB";
  EXPECT_EQ(Run(out, err), 1);
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
}

TEST(SimulateDefaultTrace, IsFixed) {
  const Trace a = GenerateTrace(DefaultSimulateTrace()).value();
  const Trace b = GenerateTrace(DefaultSimulateTrace()).value();
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_TRUE(a == b);
}

}  // namespace
}  // namespace hkv::cli
