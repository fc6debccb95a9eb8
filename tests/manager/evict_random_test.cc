// Random scenarios with Evict: requests sharing prefixes, chunked prefill, decode, forks, frees
// and evictions of random slot sets, against a model of what each full-attention slot must hold.
// The test plays the engine: it writes a value per computed position into a simulated memory at
// the slots the manager gives, applies copy-on-write copies, moves kept rows after Evict as an
// engine must (old table -> new table, slot order), and fills freed blocks without identity with
// garbage. After every call the invariant checker runs and every live request's slots must hold
// exactly its tokens' values: a shared block written, a stale block read, a hit on data computed
// after an eviction, or a lost row shows.
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

constexpr int32_t kBs = 4;
constexpr int64_t kGarbage = -7;

struct Model {
  std::vector<int32_t> tokens;  // known tokens
  std::vector<int64_t> slots;   // expected value of each full-attention slot
  bool evicted = false;         // later positions depend on what was dropped
  bool started = false;
  uint64_t uid = 0;
};

// What a dense computation writes at position p: a function of the tokens up to p.
int64_t Dense(const std::vector<int32_t>& tokens, int64_t p) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i <= p; ++i)
    h = (h ^ static_cast<uint64_t>(tokens[static_cast<size_t>(i)])) * 1099511628211ull;
  return static_cast<int64_t>(h >> 2);
}

class EvictRandom : public ::testing::TestWithParam<int> {};

TEST_P(EvictRandom, SlotsHoldTheirTokensThroughEvictionsForksAndHits) {
  std::mt19937 rng(static_cast<uint32_t>(GetParam()));
  const auto below = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  ManagerConfig c = MakeConfig({48, 48, 40}, {Full(kBs, 0), Window(6, kBs, 1), StateGroup(2)});
  KvCacheManager m = KvCacheManager::Create(c).value();
  std::vector<int64_t> mem(48 * kBs, kGarbage);
  std::map<RequestId, Model> live;
  RequestId next = 1;
  uint64_t next_uid = 1;
  const std::vector<std::vector<int32_t>> bases = {Seq(24, 10), Seq(24, 50), Seq(24, 90)};

  const auto at = [&](RequestId id, int64_t slot) -> int64_t& {
    const auto table = m.BlockTable(id, 0).value();
    return mem[static_cast<size_t>(table[static_cast<size_t>(slot / kBs)] * kBs + slot % kBs)];
  };
  const auto poison = [&] {
    std::vector<int32_t> freed;
    ASSERT_TRUE(ManagerProbe::UncachedFreeBlocks(m, 0, freed).ok());
    for (int32_t b : freed)
      std::fill_n(mem.begin() + b * kBs, kBs, kGarbage);
  };
  const auto check = [&] {
    const Status inv = m.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
    for (auto& [id, q] : live) {
      for (size_t i = 0; i < q.slots.size(); ++i)
        ASSERT_EQ(at(id, static_cast<int64_t>(i)), q.slots[i]) << "request " << id << " slot " << i;
    }
  };
  const auto value = [&](const Model& q, int64_t p) {
    return q.evicted ? static_cast<int64_t>(q.uid * 100000 + static_cast<uint64_t>(p))
                     : Dense(q.tokens, p);
  };
  const auto pick = [&]() -> RequestId {
    if (live.empty()) return 0;
    auto it = live.begin();
    std::advance(it, below(static_cast<int>(live.size())));
    return it->first;
  };

  int64_t evictions = 0, hits = 0, forks = 0;
  for (int op = 0; op < 600; ++op) {
    const int kind = below(10);
    if (kind == 0 || live.empty()) {  // a new request: a shared prefix, then its own tokens
      std::vector<int32_t> prompt = bases[static_cast<size_t>(below(3))];
      prompt.resize(static_cast<size_t>(4 + below(20)));
      for (int i = below(6); i > 0; --i)
        prompt.push_back(below(5));
      RequestSpec spec;
      spec.id = next;
      spec.prompt = prompt;
      ASSERT_TRUE(m.AddRequest(spec).ok());
      live[next++] = Model{prompt, {}, false, false, next_uid++};
    } else if (kind <= 4) {  // a step: the rest of the prompt in chunks, or one decode token
      const RequestId id = pick();
      Model& q = live[id];
      PrefixHit hit;
      if (!q.started) hit = m.Lookup(id).value();
      const int64_t computed = q.started ? m.NumComputed(id).value() : hit.tokens;
      if (computed == static_cast<int64_t>(q.tokens.size())) {
        const int32_t t = below(5);
        ASSERT_TRUE(m.AppendTokens(id, {&t, 1}).ok());
        q.tokens.push_back(t);
      }
      const int64_t n = std::min<int64_t>(1 + below(7), q.tokens.size() - computed);
      const Status s = m.Allocate(id, n, hit);
      if (s.code() == StatusCode::kResourceExhausted) {
        ASSERT_TRUE(m.Free(id).ok());
        live.erase(id);
        poison();
        check();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      if (!q.started) {
        hits += hit.tokens;
        for (int64_t p = 0; p < hit.tokens; ++p)
          q.slots.push_back(Dense(q.tokens, p));  // what the hit must bring
        q.started = true;
      }
      const StepInfo step = m.Step(id).value();
      for (const BlockCopy& cp : step.copies) {
        if (cp.group != 0) continue;
        std::copy_n(mem.begin() + cp.src * kBs, kBs, mem.begin() + cp.dst * kBs);
      }
      std::vector<int64_t> slots;
      ASSERT_TRUE(m.SlotMapping(id, 0, step.begin, step.end, slots).ok());
      for (int64_t p = step.begin; p < step.end; ++p) {
        const int64_t v = value(q, p);
        mem[static_cast<size_t>(slots[static_cast<size_t>(p - step.begin)])] = v;
        q.slots.push_back(v);
      }
      ASSERT_TRUE(m.Commit(id, step.end).ok());
      poison();
    } else if (kind <= 6) {  // evict a random set of slots
      const RequestId id = pick();
      Model& q = live[id];
      const auto n = static_cast<int64_t>(q.slots.size());
      if (n == 0) continue;
      std::vector<int32_t> keep;
      for (int32_t i = 0; i < n; ++i) {
        if (below(3) != 0) keep.push_back(i);
      }
      int64_t unchanged = 0;
      while (unchanged < static_cast<int64_t>(keep.size()) &&
             keep[static_cast<size_t>(unchanged)] == unchanged)
        ++unchanged;
      const auto before = m.BlockTable(id, 0).value();
      const std::vector<int32_t> old_table(before.begin(), before.end());
      const Result<EvictResult> e = m.Evict(id, 0, static_cast<int64_t>(keep.size()), unchanged);
      if (!e.ok()) {
        ASSERT_EQ(e.status().code(), StatusCode::kResourceExhausted) << e.status().ToString();
        check();
        continue;
      }
      const auto after = m.BlockTable(id, 0).value();
      for (size_t s = static_cast<size_t>(e->write_from); s < keep.size(); ++s) {
        const int64_t src = keep[s];
        mem[static_cast<size_t>(after[s / kBs] * kBs + static_cast<int32_t>(s % kBs))] =
            mem[static_cast<size_t>(old_table[static_cast<size_t>(src / kBs)] * kBs + src % kBs)];
      }
      std::vector<int64_t> kept;
      for (int32_t k : keep)
        kept.push_back(q.slots[static_cast<size_t>(k)]);
      if (static_cast<int64_t>(keep.size()) < n) {
        q.evicted = true;
        ++evictions;
      }
      q.slots = kept;
      poison();
    } else if (kind == 7) {
      const RequestId parent = pick();
      if (!live[parent].started) continue;
      ASSERT_TRUE(m.Fork(parent, next).ok());
      Model child = live[parent];
      child.uid = next_uid++;
      // Until it evicts on its own, the child's new positions are what the parent's would be.
      live[next++] = child;
      ++forks;
      // A child's later positions after an inherited eviction are its own computation.
    } else {
      const RequestId id = pick();
      ASSERT_TRUE(m.Free(id).ok());
      live.erase(id);
      poison();
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(evictions, 20);
  EXPECT_GT(hits, 0);
  EXPECT_GT(forks, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, EvictRandom, ::testing::Range(1, 9));

}  // namespace
}  // namespace hkv::testing
