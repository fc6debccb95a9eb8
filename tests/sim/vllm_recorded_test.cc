// vLLM's real KV cache manager, recorded: tests/data/vllm/<trace>/ holds, for traces made by
// `hkv trace gen`, the per-request logs and figures of ../shared/vllm_reference (vLLM's
// unmodified manager) for every reference config at several memory sizes
// (scripts/vllm_conformance.py --record; tests/data/vllm/README.md). ReplayVllm must reproduce
// every request's arrival, first scheduled step, first-admission hit tokens, preemptions and
// finish step, and the run's steps, preemptions, scheduled tokens, peak blocks, peak running and
// block ids (the reference's digest of every block id handed to the model runner);
// where vLLM refused the memory size, hkv must refuse it too.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>
#include <hkv/spec/config_loader.h>
#include <hkv/vllm/kv_cache_config.h>

namespace hkv {
namespace {

namespace fs = std::filesystem;

struct ReferenceConfig {
  const char* name;
  const char* model;
  vllm::MambaCacheMode mode;
};

// The configs of run_vllm_manager.py and the bundled models with the same geometry.
constexpr ReferenceConfig kConfigs[] = {
    {"llama3_8b", "meta-llama--Llama-3.1-8B", vllm::MambaCacheMode::kAuto},
    {"gemma2_9b", "google--gemma-2-9b", vllm::MambaCacheMode::kAuto},
    {"gemma3_4b", "google--gemma-3-4b-it", vllm::MambaCacheMode::kAuto},
    {"gptoss_20b", "openai--gpt-oss-20b", vllm::MambaCacheMode::kAuto},
    {"bamba_9b", "ibm-ai-platform--Bamba-9B", vllm::MambaCacheMode::kAll},
    {"bamba_9b_align", "ibm-ai-platform--Bamba-9B", vllm::MambaCacheMode::kAlign},
    {"qwen3next", "Qwen--Qwen3-Next-80B-A3B-Instruct", vllm::MambaCacheMode::kAlign},
    {"jamba", "ai21labs--Jamba-v0.1", vllm::MambaCacheMode::kAlign},
};

fs::path DataDir() {
  return fs::path(HKV_TEST_DATA_DIR) / "vllm";
}

std::vector<std::string> RecordedTraces() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(DataDir())) {
    if (e.is_directory() && fs::exists(e.path() / "summary.json"))
      names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<RequestRecord> ReadRequests(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);  // header
  std::vector<RequestRecord> out;
  while (std::getline(f, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream in(line);
    RequestRecord r;
    in >> r.id >> r.arrival_step >> r.first_scheduled_step >> r.first_hit_tokens >> r.preemptions >>
        r.finish_step;
    out.push_back(r);
  }
  return out;
}

class VllmRecorded : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(VllmRecorded, EveryRequestAsVllm) {
  const auto& [trace_name, config_index] = GetParam();
  const ReferenceConfig& rc = kConfigs[config_index];
  const fs::path dir = DataDir() / trace_name;
  std::ifstream sf(dir / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf);
  TraceGenOptions g;
  g.num_requests = summary["trace"]["requests"].get<int64_t>();
  g.seed = summary["trace"]["seed"].get<uint64_t>();
  g.session_gap = summary["trace"]["session_gap"].get<double>();
  const Trace trace = GenerateTrace(g).value();
  const ModelSpec model = LoadModelConfig(fs::path(HKV_MODELS_DIR) / rc.model).value();
  int cases = 0;
  for (const auto& [key, expected] : summary["cases"].items()) {
    const std::string prefix = std::string(rc.name) + "_";
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string gib = key.substr(prefix.size(), key.size() - prefix.size() - 3);
    if (gib.find('_') != std::string::npos) continue;  // bamba_9b_align_* under bamba_9b
    ++cases;
    SCOPED_TRACE(trace_name + " " + key);
    vllm::KvCacheOptions o;
    o.memory_bytes = static_cast<int64_t>(std::stod(gib) * static_cast<double>(int64_t{1} << 30));
    o.mamba_cache_mode = rc.mode;
    const Result<vllm::KvCacheConfig> config = vllm::MakeKvCacheConfig(model, o);
    if (expected.contains("refused")) {
      ASSERT_FALSE(config.ok());
      EXPECT_EQ(config.status().code(), StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(config.ok()) << config.status().message();
    ReplayOptions ro;
    ro.record_requests = true;
    const Result<ReplayReport> r = ReplayVllm(trace, *config, ro);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->steps, expected["steps"].get<int64_t>());
    EXPECT_EQ(r->preemptions, expected["preemptions"].get<int64_t>());
    EXPECT_EQ(r->scheduled_tokens, expected["scheduled_tokens"].get<int64_t>());
    EXPECT_EQ(r->peak_blocks_used, expected["peak_blocks_used"].get<int64_t>());
    EXPECT_EQ(r->peak_running, expected["peak_running"].get<int64_t>());
    // Every block id handed to the model runner, through the reference's digest.
    EXPECT_EQ(r->block_id_digest, expected["block_id_digest"].get<uint64_t>());
    const std::vector<RequestRecord> want = ReadRequests(dir / (key + ".csv"));
    ASSERT_EQ(r->requests.size(), want.size());
    int differing = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (r->requests[i] == want[i]) continue;
      if (++differing <= 3) {
        const RequestRecord& a = r->requests[i];
        const RequestRecord& b = want[i];
        ADD_FAILURE() << "request " << b.id << ": hkv (sched " << a.first_scheduled_step << ", hit "
                      << a.first_hit_tokens << ", preempt " << a.preemptions << ", finish "
                      << a.finish_step << ") vLLM (sched " << b.first_scheduled_step << ", hit "
                      << b.first_hit_tokens << ", preempt " << b.preemptions << ", finish "
                      << b.finish_step << ")";
      }
    }
    EXPECT_EQ(differing, 0);
  }
  EXPECT_GE(cases, 2) << "every config is recorded at two memory sizes or more";
}

INSTANTIATE_TEST_SUITE_P(
    Logs, VllmRecorded,
    ::testing::Combine(::testing::ValuesIn(RecordedTraces()),
                       ::testing::Range(0, static_cast<int>(std::size(kConfigs)))),
    [](const auto& param_info) {
      return std::get<0>(param_info.param) + "_" + kConfigs[std::get<1>(param_info.param)].name;
    });

}  // namespace
}  // namespace hkv
