// Helpers shared by the manager tests: small hand-built configs and a driver that runs requests
// through the manager the way an engine does, checking the invariants after every call.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/kv_cache_manager.h>

namespace hkv::testing {

inline GroupConfig Full(int32_t bs, int32_t pool = 0) {
  return {{TokenRuleKind::kAll, 0, 0}, bs, pool};
}
inline GroupConfig Window(int32_t span, int32_t bs, int32_t pool = 0, int32_t sinks = 0) {
  return {{TokenRuleKind::kWindow, span, sinks}, bs, pool};
}
inline GroupConfig Chunk(int32_t span, int32_t bs, int32_t pool = 0) {
  return {{TokenRuleKind::kChunk, span, 0}, bs, pool};
}
inline GroupConfig Encoder(int32_t bs, int32_t pool = 0) {
  return {{TokenRuleKind::kEncoder, 0, 0}, bs, pool};
}
inline GroupConfig StateGroup(int32_t pool = 0) {
  return {{TokenRuleKind::kState, 0, 0}, 0, pool};
}

inline ManagerConfig MakeConfig(std::vector<int32_t> pools, std::vector<GroupConfig> groups,
                                int64_t max_len = 1024) {
  ManagerConfig c;
  c.pool_blocks = std::move(pools);
  c.groups = std::move(groups);
  c.max_model_len = max_len;
  c.max_encoder_tokens = 256;
  c.state_align_tokens = 4;
  return c;
}

// Tokens base, base+1, ... so prompts built from the same base share prefixes.
inline std::vector<int32_t> Seq(int32_t n, int32_t base = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), base);
  return v;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Driver {
 public:
  explicit Driver(const ManagerConfig& c) : m_(KvCacheManager::Create(c).value()) {}

  KvCacheManager& m() { return m_; }

  void Check() {
    Status s = m_.CheckInvariants();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  void Add(RequestId id, const std::vector<int32_t>& prompt, RequestSpec spec = {}) {
    spec.id = id;
    spec.prompt = prompt;
    Status s = m_.AddRequest(spec);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Check();
  }

  PrefixHit Lookup(RequestId id) {
    PrefixHit hit = m_.Lookup(id).value();
    Check();
    return hit;
  }

  // Looks up and computes the whole prompt in one step; returns the hit it used.
  PrefixHit Prefill(RequestId id) {
    const PrefixHit hit = Lookup(id);
    const int64_t n = m_.NumTokens(id).value();
    Run(id, n - hit.tokens, hit);
    return hit;
  }

  void Run(RequestId id, int64_t tokens, const PrefixHit& hit = {}, int64_t lookahead = 0) {
    Status s = m_.Allocate(id, tokens, hit, lookahead);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Check();
    const StepInfo step = m_.Step(id).value();
    s = m_.Commit(id, step.end);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Check();
  }

  // One decode step: the sampled token becomes known, then it is computed.
  void Decode(RequestId id, int32_t token) {
    ASSERT_TRUE(m_.AppendTokens(id, {&token, 1}).ok());
    Run(id, 1);
  }

  void Free(RequestId id) {
    Status s = m_.Free(id);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Check();
  }

  std::vector<int32_t> Table(RequestId id, int32_t group) {
    auto t = m_.BlockTable(id, group).value();
    return {t.begin(), t.end()};
  }

 private:
  KvCacheManager m_;
};

}  // namespace hkv::testing
