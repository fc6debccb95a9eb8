// Hits with blocks from an external store (a connector's tiers): Lookup(id, external) counts them,
// the first Allocate gives each a private block to load into, FinishLoad publishes them or
// returns the request to where it was after AddRequest.
#include <algorithm>
#include <unordered_set>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

// What another engine published: every stored identity it reported.
class FakeStore : public ExternalBlocks {
 public:
  bool Has(const PrefixKey& key) const override {
    ++has_calls;
    return keys_.count(key) > 0;
  }
  bool AnswersInBatches() const override { return batched; }
  void HasMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const override {
    ++batches;
    for (size_t i = 0; i < keys.size(); ++i)
      out[i] = keys_.count(keys[i]) > 0 ? 1 : 0;
  }
  void Take(KvCacheManager& m) {
    for (const ManagerEvent& e : m.TakeEvents()) {
      if (e.kind == KvEvent::Kind::kStored) keys_.insert({e.hash, e.group});
    }
  }
  void Erase(const PrefixKey& key) { keys_.erase(key); }
  size_t size() const { return keys_.size(); }
  bool batched = true;            // as a remote store would
  mutable int64_t has_calls = 0;  // one key at a time
  mutable int64_t batches = 0;    // HasMany calls

 private:
  std::unordered_set<PrefixKey, PrefixKeyHash> keys_;
};

int32_t Held(const KvCacheManager& m, int32_t pool) {
  const PoolUsage u = m.Usage(pool);
  return u.num_blocks - u.num_free;
}

// Fills `store` with what a first manager publishes computing `prompt` and decoding a few
// tokens; returns the hit that manager itself finds for the same prompt afterwards.
PrefixHit Publish(const ManagerConfig& c, const std::vector<int32_t>& prompt, FakeStore& store) {
  Driver d(c);
  d.Add(1, prompt);
  d.Prefill(1);
  for (int32_t t = 0; t < 3; ++t)
    d.Decode(1, 7 + t);
  d.Free(1);
  store.Take(d.m());
  d.Add(2, prompt);
  return d.Lookup(2);
}

TEST(ExternalLoadTest, FullAttentionHitLoadsIntoPrivateBlocksAndPublishesOnCompletion) {
  const ManagerConfig c = MakeConfig({32}, {Full(4)});
  FakeStore store;
  ASSERT_EQ(Publish(c, Seq(20), store).tokens, 16);
  Driver d(c);
  d.Add(1, Seq(20));
  EXPECT_EQ(d.Lookup(1).tokens, 0);  // nothing local
  const PrefixHit hit = d.m().Lookup(1, store).value();
  EXPECT_EQ(hit.tokens, 16);
  EXPECT_EQ(hit.loads, 4);
  EXPECT_EQ(d.m().stats().external_hit_tokens, 16);
  ASSERT_TRUE(d.m().Allocate(1, 4, hit).ok());
  d.Check();
  const StepInfo step = d.m().Step(1).value();
  EXPECT_EQ(step.begin, 16);
  ASSERT_EQ(step.loads.size(), 4u);
  const std::vector<int32_t> table = d.Table(1, 0);
  ASSERT_EQ(table.size(), 5u);
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(step.loads[j].block, table[j]);
    EXPECT_EQ(step.loads[j].group, 0);
    EXPECT_FALSE(step.loads[j].state);
    EXPECT_TRUE(store.Has(step.loads[j].key));
  }
  // Nothing is published before the load completed: another request finds nothing local.
  d.Add(2, Seq(20));
  EXPECT_EQ(d.Lookup(2).tokens, 0);
  // The step cannot run ahead of its loads.
  EXPECT_EQ(d.m().Commit(1, 20).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.m().Allocate(1, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.m().Fork(1, 9).code(), StatusCode::kFailedPrecondition);
  d.Check();
  ASSERT_TRUE(d.m().FinishLoad(1, true).ok());
  d.Check();
  EXPECT_TRUE(d.m().Step(1).value().loads.empty());
  EXPECT_EQ(d.m().stats().blocks_loaded, 4);
  EXPECT_EQ(d.Lookup(2).tokens, 16);  // published now
  ASSERT_TRUE(d.m().Commit(1, 20).ok());
  d.Check();
  EXPECT_EQ(d.m().FinishLoad(1, true).code(), StatusCode::kFailedPrecondition);
  d.Free(1);
  d.Free(2);
  EXPECT_EQ(Held(d.m(), 0), 0);
}

TEST(ExternalLoadTest, OnlyBlocksMissingLocallyAreLoaded) {
  const ManagerConfig c = MakeConfig({32}, {Full(4)});
  FakeStore store;
  Publish(c, Seq(20), store);
  Driver d(c);
  d.Add(1, Seq(9));  // publishes blocks 0 and 1 of the same prefix
  d.Prefill(1);
  d.Add(2, Seq(20));
  const PrefixHit hit = d.m().Lookup(2, store).value();
  EXPECT_EQ(hit.tokens, 16);
  EXPECT_EQ(hit.loads, 2);
  ASSERT_TRUE(d.m().Allocate(2, 4, hit).ok());
  const StepInfo step = d.m().Step(2).value();
  ASSERT_EQ(step.loads.size(), 2u);
  const std::vector<int32_t> mine = d.Table(1, 0), table = d.Table(2, 0);
  EXPECT_EQ(table[0], mine[0]);  // shared with request 1
  EXPECT_EQ(table[1], mine[1]);
  EXPECT_EQ(step.loads[0].block, table[2]);
  EXPECT_EQ(step.loads[1].block, table[3]);
  ASSERT_TRUE(d.m().FinishLoad(2, true).ok());
  ASSERT_TRUE(d.m().Commit(2, 20).ok());
  d.Check();
  d.Free(1);
  d.Free(2);
}

TEST(ExternalLoadTest, AFailedLoadReturnsTheRequestToItsStartAndChangesNoCache) {
  const ManagerConfig c = MakeConfig({32}, {Full(4)});
  FakeStore store;
  Publish(c, Seq(20), store);
  Driver d(c);
  d.Add(1, Seq(9));
  d.Prefill(1);
  d.Add(2, Seq(20));
  const int32_t cached_before = d.m().Usage(0).num_cached;
  const PrefixHit hit = d.m().Lookup(2, store).value();
  ASSERT_TRUE(d.m().Allocate(2, 4, hit).ok());
  const std::vector<BlockLoad> loads(d.m().Step(2).value().loads.begin(),
                                     d.m().Step(2).value().loads.end());
  ASSERT_TRUE(d.m().FinishLoad(2, false).ok());
  d.Check();
  EXPECT_EQ(d.m().stats().loads_failed, 1);
  EXPECT_EQ(d.m().stats().blocks_loaded, 0);
  EXPECT_EQ(d.m().Usage(0).num_cached, cached_before);  // no identity given to a load target
  EXPECT_EQ(Held(d.m(), 0), 3);                         // request 1's blocks only
  // The load targets are reused first: nobody will ever read what they hold.
  const std::vector<int32_t> order = ManagerProbe::FreeListOrder(d.m(), 0);
  for (const BlockLoad& l : loads)
    EXPECT_NE(std::find(order.begin(), order.begin() + 4, l.block), order.begin() + 4);
  EXPECT_EQ(d.m().Step(2).status().code(), StatusCode::kFailedPrecondition);
  // As after AddRequest: look up again (locally) and compute the rest.
  const PrefixHit local = d.Lookup(2);
  EXPECT_EQ(local.tokens, 8);
  EXPECT_EQ(local.loads, 0);
  d.Run(2, 12, local);
  d.Free(1);
  d.Free(2);
  EXPECT_EQ(Held(d.m(), 0), 0);
}

TEST(ExternalLoadTest, FreeWhileLoadingReleasesEverything) {
  const ManagerConfig c = MakeConfig({32}, {Full(4), StateGroup(1)});
  ManagerConfig cc = c;
  cc.pool_blocks = {32, 32};
  FakeStore store;
  Publish(cc, Seq(21), store);
  Driver d(cc);
  d.Add(1, Seq(21));
  const PrefixHit hit = d.m().Lookup(1, store).value();
  ASSERT_GT(hit.loads, 0);
  ASSERT_TRUE(d.m().Allocate(1, 21 - hit.tokens, hit).ok());
  d.Check();
  d.Free(1);
  EXPECT_EQ(Held(d.m(), 0), 0);
  EXPECT_EQ(Held(d.m(), 1), 0);
  EXPECT_EQ(d.m().Usage(0).num_cached, 0);
  EXPECT_EQ(d.m().Usage(1).num_cached, 0);
}

// The hit a fresh manager finds through the store equals the one the publishing manager finds
// locally, for every mix of groups; loading and continuing then gives the same tables' shape.
TEST(ExternalLoadTest, ExternalHitEqualsThePublishersLocalHitForEveryGroupMix) {
  struct Case {
    const char* name;
    ManagerConfig config;
  };
  std::vector<Case> cases = {
      {"full", MakeConfig({64}, {Full(4)})},
      {"full+window", MakeConfig({64}, {Full(4), Window(6, 4)})},
      {"window+sinks", MakeConfig({64}, {Full(4), Window(5, 4, 0, 2)})},
      {"full+chunk", MakeConfig({64}, {Full(4), Chunk(8, 4)})},
      {"full+state", MakeConfig({64, 64}, {Full(4), StateGroup(1)})},
      {"window+state", MakeConfig({64, 64}, {Window(6, 4), StateGroup(1)})},
  };
  cases[4].config.checkpoint_interval = 8;
  int loaded_hits = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    for (int32_t len : {9, 17, 26, 33}) {
      SCOPED_TRACE(len);
      FakeStore store;
      const PrefixHit want = Publish(k.config, Seq(len), store);
      Driver d(k.config);
      d.Add(1, Seq(len));
      store.has_calls = store.batches = 0;
      const PrefixHit hit = d.m().Lookup(1, store).value();
      EXPECT_EQ(hit.tokens, want.tokens);
      // Every key the hit rules asked about was in the one batch: one question to the store.
      EXPECT_EQ(store.batches, 1);
      EXPECT_EQ(store.has_calls, 0);
      {
        // A store that does not batch is asked key by key, for the same hit.
        store.batched = false;
        store.has_calls = store.batches = 0;
        Driver single(k.config);
        single.Add(1, Seq(len));
        EXPECT_EQ(single.m().Lookup(1, store).value().tokens, want.tokens);
        EXPECT_EQ(store.batches, 0);
        store.batched = true;
      }
      if (hit.tokens == 0) {
        EXPECT_EQ(hit.loads, 0);
        continue;
      }
      ASSERT_TRUE(d.m().Allocate(1, len - hit.tokens, hit).ok());
      d.Check();
      const StepInfo step = d.m().Step(1).value();
      EXPECT_EQ(static_cast<int32_t>(step.loads.size()), hit.loads);
      for (const BlockLoad& l : step.loads)
        EXPECT_TRUE(store.Has(l.key));
      loaded_hits += hit.loads > 0 ? 1 : 0;
      ASSERT_TRUE(d.m().FinishLoad(1, true).ok());
      d.Check();
      ASSERT_TRUE(d.m().Commit(1, len).ok());
      d.Check();
      d.Decode(1, 3);
      // A second request now hits everything locally.
      d.Add(2, Seq(len));
      const PrefixHit again = d.m().Lookup(2, store).value();
      EXPECT_EQ(again.tokens, want.tokens);
      EXPECT_EQ(again.loads, 0);
      d.Free(1);
    }
  }
  EXPECT_GE(loaded_hits, 18);
}

TEST(ExternalLoadTest, AHitThatNeedsMoreLoadsThanPlannedIsStale) {
  ManagerConfig c = MakeConfig({8}, {Full(4)});
  FakeStore store;
  Publish(c, Seq(20), store);
  Driver d(c);
  d.Add(1, Seq(9));
  d.Prefill(1);
  d.Free(1);  // blocks 0, 1 cached, free
  d.Add(2, Seq(20));
  const PrefixHit hit = d.m().Lookup(2, store).value();
  ASSERT_EQ(hit.loads, 2);
  // Another request takes every block: the cached ones are evicted.
  d.Add(3, Seq(28, 900));
  d.Run(3, 28);
  d.Free(3);
  const int32_t cached = d.m().Usage(0).num_cached;
  const Status s = d.m().Allocate(2, 4, hit);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("stale"), std::string::npos) << s.ToString();
  EXPECT_EQ(d.m().Usage(0).num_cached, cached);
  EXPECT_EQ(Held(d.m(), 0), 0);
  d.Check();
  // Looked up again, the hit plans four loads.
  const PrefixHit again = d.m().Lookup(2, store).value();
  EXPECT_EQ(again.loads, 4);
  ASSERT_TRUE(d.m().Allocate(2, 4, again).ok());
  ASSERT_TRUE(d.m().FinishLoad(2, true).ok());
  ASSERT_TRUE(d.m().Commit(2, 20).ok());
  d.Check();
  d.Free(2);
}

TEST(ExternalLoadTest, BadCallsAreRefusedAndChangeNothing) {
  const ManagerConfig c = MakeConfig({32}, {Full(4)});
  FakeStore store;
  Publish(c, Seq(20), store);
  Driver d(c);
  EXPECT_EQ(d.m().FinishLoad(5, true).code(), StatusCode::kNotFound);
  d.Add(1, Seq(20));
  EXPECT_EQ(d.m().FinishLoad(1, false).code(), StatusCode::kFailedPrecondition);
  // Loads without tokens, or negative, are not hits Lookup returns.
  EXPECT_EQ(d.m().Allocate(1, 4, PrefixHit{0, false, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.m().Allocate(1, 4, PrefixHit{16, false, -1}).code(), StatusCode::kInvalidArgument);
  // A hit with external blocks but no loads planned is stale.
  EXPECT_EQ(d.m().Allocate(1, 4, PrefixHit{16, false, 0}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Held(d.m(), 0), 0);
  d.Check();
  d.Run(1, 20);
  const PrefixHit late{16, false, 4};
  EXPECT_EQ(d.m().Allocate(1, 1, late).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.m().Lookup(1, store).status().code(), StatusCode::kFailedPrecondition);
  d.Check();
  d.Free(1);
}

// Stored events say which request published a block and where its tokens start (a state
// checkpoint: the position it follows), including blocks published by FinishLoad.
TEST(ExternalLoadTest, StoredEventsNameTheRequestAndPosition) {
  const ManagerConfig c = MakeConfig({64, 64}, {Full(4), StateGroup(1)});
  FakeStore store;
  Publish(c, Seq(21), store);
  Driver d(c);
  d.Add(7, Seq(21));
  const PrefixHit hit = d.m().Lookup(7, store).value();
  ASSERT_GT(hit.loads, 0);
  ASSERT_TRUE(d.m().Allocate(7, 21 - hit.tokens, hit).ok());
  ASSERT_TRUE(d.m().FinishLoad(7, true).ok());
  std::vector<ManagerEvent> events = d.m().TakeEvents();
  ASSERT_EQ(static_cast<int32_t>(events.size()), hit.loads);
  for (const ManagerEvent& e : events) {
    EXPECT_EQ(e.request, 7u);
    if (e.group == 0) {
      EXPECT_EQ(e.position % 4, 0);
      EXPECT_LT(e.position, hit.tokens);
    } else {
      EXPECT_EQ(e.position, hit.tokens);  // the checkpoint the hit continues from
    }
  }
  ASSERT_TRUE(d.m().Commit(7, 21).ok());
  d.Decode(7, 3);
  d.Free(7);
  for (const ManagerEvent& e : d.m().TakeEvents()) {
    if (e.kind != KvEvent::Kind::kStored) continue;
    EXPECT_EQ(e.request, 7u);
    EXPECT_GE(e.position, hit.tokens);  // published by this request's own steps
    if (e.group == 0) {
      EXPECT_EQ(e.position % 4, 0);
    }
  }
}

}  // namespace
}  // namespace hkv::testing
