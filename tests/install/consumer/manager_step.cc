// Plans a bundled hybrid model (Gemma-2: sliding window + full attention), makes a manager from
// the plan and serves two requests with the same prompt: the second must hit what the first
// computed. Exits non-zero, saying why, on anything else. MODELS_DIR comes from the installed
// package (hybridkv_MODELS_DIR) or from the pkg-config build's command line.
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <hkv/common/version.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/manager/manager_config.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace {

int Fail(const char* what, const hkv::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  auto model = hkv::LoadModelConfig(MODELS_DIR "/google--gemma-2-9b");
  if (!model.ok()) return Fail("load", model.status());
  hkv::PlanOptions options;
  options.memory_bytes = int64_t{4} << 30;
  options.max_model_len = 4096;
  auto plan = hkv::MakePlan(*model, options);
  if (!plan.ok()) return Fail("plan", plan.status());
  auto config = hkv::ManagerConfig::FromPlan(*plan);
  if (!config.ok()) return Fail("config", config.status());
  auto made = hkv::KvCacheManager::Create(*config);
  if (!made.ok()) return Fail("manager", made.status());
  hkv::KvCacheManager& manager = *made;

  std::vector<int32_t> prompt(100);
  std::iota(prompt.begin(), prompt.end(), 1);
  int64_t hits[2] = {0, 0};
  for (hkv::RequestId id : {1, 2}) {
    hkv::RequestSpec spec;
    spec.id = id;
    spec.prompt = prompt;
    if (auto s = manager.AddRequest(spec); !s.ok()) return Fail("add", s);
    auto hit = manager.Lookup(id);
    if (!hit.ok()) return Fail("lookup", hit.status());
    hits[id - 1] = hit->tokens;
    const auto todo = static_cast<int64_t>(prompt.size()) - hit->tokens;
    if (auto s = manager.Allocate(id, todo, *hit); !s.ok()) return Fail("allocate", s);
    if (auto s = manager.Commit(id, static_cast<int64_t>(prompt.size())); !s.ok()) {
      return Fail("commit", s);
    }
    if (auto s = manager.Free(id); !s.ok()) return Fail("free", s);
    if (auto s = manager.CheckInvariants(); !s.ok()) return Fail("invariants", s);
  }
  std::printf("hybridkv %s: %s, %d groups; first request hit %lld tokens, second %lld\n",
              std::string(hkv::Version()).c_str(), model->model_type.c_str(),
              static_cast<int>(config->groups.size()), static_cast<long long>(hits[0]),
              static_cast<long long>(hits[1]));
  if (hits[0] != 0 || hits[1] <= 0) {
    std::fprintf(stderr, "expected a miss, then a hit on the shared prompt\n");
    return 1;
  }
  return 0;
}
