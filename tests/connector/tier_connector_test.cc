// TierConnector: what one manager publishes reaches the tiers byte for byte, and another manager
// over other memory loads it back in the background into the blocks its hit asked for.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include <hkv/connector/disk_tier.h>
#include <hkv/connector/host_tier.h>
#include <hkv/connector/tier_connector.h>

#include "connector_test_util.h"
#include "tier_test_util.h"

namespace hkv::testing {
namespace {

std::vector<unsigned char> Image(const BlockMemoryView& view, int32_t group, int64_t block) {
  std::vector<BlockRegion> regions;
  EXPECT_TRUE(view.Regions(group, block, regions).ok());
  std::vector<unsigned char> out;
  for (const BlockRegion& r : regions)
    out.insert(out.end(), r.data, r.data + r.bytes);
  return out;
}

std::vector<int32_t> Prompt(int32_t n) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i)
    p.push_back(1000 + i);
  return p;
}

// One side: a plan's memory, its view, a manager and a connector over the shared tiers.
struct Side {
  Plan plan;
  PlanMemory memory;
  BlockMemoryView view;
  KvCacheManager manager;
  std::unique_ptr<TierConnector> connector;

  Side(const ModelSpec& model, uint64_t seed, std::vector<Tier*> tiers)
      : plan(PlanOf(model, TensorLayout::kCanonical, PageStrategy::kAuto)),
        memory(plan, seed),
        view(memory.View(plan)),
        manager(KvCacheManager::Create(ManagerConfig::FromPlan(plan).value()).value()),
        connector(TierConnector::Create(view, std::move(tiers)).value()) {}

  void Add(RequestId id, const std::vector<int32_t>& prompt) {
    RequestSpec spec;
    spec.id = id;
    spec.prompt = prompt;
    ASSERT_TRUE(manager.AddRequest(spec).ok());
  }
};

TEST(TierConnectorTest, PublishedBlocksTravelThroughTheTierIntoTheHitsBlocks) {
  for (const ModelSpec& model : {Gemma2Like(), MambaHybrid()}) {
    SCOPED_TRACE(model.source);
    HostTier host(int64_t{64} << 20);
    Side a(model, 1, {&host});
    Side b(model, 2, {&host});
    const std::vector<int32_t> prompt = Prompt(100);
    a.Add(1, prompt);
    ASSERT_TRUE(a.manager.Allocate(1, 100).ok());
    ASSERT_TRUE(a.manager.Commit(1, 100).ok());
    const std::vector<ManagerEvent> events = a.manager.TakeEvents();
    ASSERT_FALSE(events.empty());
    ASSERT_TRUE(a.connector->Store(events).ok());
    EXPECT_GT(a.connector->stats().blocks_stored, 0);
    for (const ManagerEvent& e : events) {
      if (e.kind != KvEvent::Kind::kStored) continue;
      EXPECT_TRUE(b.connector->Has({e.hash, e.group}));
    }
    // Storing again puts nothing new: every tier has every block.
    const int64_t stored = a.connector->stats().blocks_stored;
    ASSERT_TRUE(a.connector->Store(events).ok());
    EXPECT_EQ(a.connector->stats().blocks_stored, stored);

    b.Add(1, prompt);
    const PrefixHit hit = b.manager.Lookup(1, *b.connector).value();
    ASSERT_GT(hit.tokens, 0);
    ASSERT_GT(hit.loads, 0);
    ASSERT_TRUE(b.manager.Allocate(1, 100 - hit.tokens, hit).ok());
    const StepInfo step = b.manager.Step(1).value();
    ASSERT_TRUE(b.connector->StartLoad(1, step.loads).ok());
    EXPECT_EQ(b.connector->StartLoad(1, step.loads).code(), StatusCode::kInvalidArgument);
    ASSERT_EQ(b.connector->Wait(1), TierConnector::LoadState::kLoaded)
        << b.connector->last_failure();
    // Each loaded block holds the bytes of the block that published its identity.
    for (const BlockLoad& l : step.loads) {
      bool found = false;
      for (const ManagerEvent& e : events) {
        if (e.kind != KvEvent::Kind::kStored || PrefixKey{e.hash, e.group} != l.key) continue;
        EXPECT_EQ(Image(b.view, l.group, l.block), Image(a.view, e.group, e.block));
        found = true;
      }
      EXPECT_TRUE(found);
    }
    EXPECT_EQ(b.connector->stats().blocks_loaded, static_cast<int64_t>(step.loads.size()));
    b.connector->Forget(1);
    EXPECT_FALSE(b.connector->HasJob(1));
    ASSERT_TRUE(b.manager.FinishLoad(1, true).ok());
    ASSERT_TRUE(b.manager.Commit(1, 100).ok());
    EXPECT_TRUE(b.manager.CheckInvariants().ok());
  }
}

// Tier events: every block a Store put, under each tier's medium, as the manager reported it; and
// every entry a tier evicted to make room, as a removal. Nothing twice, nothing held back.
TEST(TierConnectorTest, TiersReportWhatTheyStoredAndDropped) {
  const ModelSpec model = Gemma2Like();
  HostTier big(int64_t{64} << 20);
  testing::ScopedTempDir tmp;
  DiskTierOptions d;
  d.capacity_bytes = int64_t{64} << 20;
  d.model = testing::TestModel();
  DiskTier disk = DiskTier::Open(tmp.path(), d).value();
  Side a(model, 1, {&big, &disk});
  const std::vector<int32_t> prompt = Prompt(100);
  a.Add(1, prompt);
  ASSERT_TRUE(a.manager.Allocate(1, 100).ok());
  ASSERT_TRUE(a.manager.Commit(1, 100).ok());
  const std::vector<ManagerEvent> events = a.manager.TakeEvents();
  ASSERT_TRUE(a.connector->Store(events).ok());
  std::vector<TierEvent> got;
  a.connector->TakeEvents(got);
  int64_t stored = 0;
  for (const ManagerEvent& e : events)
    stored += e.kind == KvEvent::Kind::kStored ? 1 : 0;
  ASSERT_EQ(static_cast<int64_t>(got.size()), 2 * stored);  // each block into both tiers
  for (const TierEvent& t : got) {
    EXPECT_TRUE(t.medium == "CPU" || t.medium == "DISK") << t.medium;
    EXPECT_EQ(t.event.kind, KvEvent::Kind::kStored);
    EXPECT_EQ(t.event.request, 1u);
  }
  got.clear();
  a.connector->TakeEvents(got);
  EXPECT_TRUE(got.empty());
  // A disk entry evicted by hand, one found damaged by a Get: two DISK removals.
  const std::vector<PrefixKey> held = disk.LruOrder();
  ASSERT_GE(held.size(), 2u);
  ASSERT_TRUE(disk.Evict(held[0]).ok());
  std::filesystem::resize_file(disk.PathOf(held[1]), 10);
  EXPECT_FALSE(disk.Get(held[1]).ok());
  a.connector->TakeEvents(got);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].medium, "DISK");
    EXPECT_EQ(got[i].event.kind, KvEvent::Kind::kRemoved);
    EXPECT_EQ((PrefixKey{got[i].event.hash, got[i].event.group}), held[i]);
  }
}

TEST(TierConnectorTest, AMissOrAForeignStreamFailsTheJobAndWritesNothingWrong) {
  HostTier host(int64_t{64} << 20);
  Side a(Gemma2Like(), 1, {&host});
  Side b(Gemma2Like(), 2, {&host});
  a.Add(1, Prompt(100));
  ASSERT_TRUE(a.manager.Allocate(1, 100).ok());
  ASSERT_TRUE(a.manager.Commit(1, 100).ok());
  ASSERT_TRUE(a.connector->Store(a.manager.TakeEvents()).ok());
  b.Add(1, Prompt(100));
  const PrefixHit hit = b.manager.Lookup(1, *b.connector).value();
  ASSERT_GE(hit.loads, 2);
  ASSERT_TRUE(b.manager.Allocate(1, 100 - hit.tokens, hit).ok());
  const StepInfo step = b.manager.Step(1).value();
  const std::vector<BlockLoad> loads(step.loads.begin(), step.loads.end());
  const std::vector<unsigned char> before = Image(b.view, loads[1].group, loads[1].block);

  // The second block's entry now holds the first block's stream: a valid stream, wrong key.
  const std::vector<unsigned char> first = host.Get(loads[0].key).value();
  const std::vector<unsigned char> second = host.Get(loads[1].key).value();
  const auto fails = [&](const std::vector<unsigned char>& stream, const std::string& what) {
    ASSERT_TRUE(host.Evict(loads[1].key).ok());
    ASSERT_TRUE(host.Put(loads[1].key, stream).ok());
    ASSERT_TRUE(b.connector->StartLoad(1, loads).ok());
    EXPECT_EQ(b.connector->Wait(1), TierConnector::LoadState::kFailed) << what;
    EXPECT_NE(b.connector->last_failure().find(what), std::string::npos)
        << b.connector->last_failure();
    EXPECT_EQ(Image(b.view, loads[1].group, loads[1].block), before) << what;
    b.connector->Forget(1);
  };
  fails(first, "holds a block of another identity");
  EXPECT_EQ(b.connector->stats().loads_failed, 1);
  // The right block's stream edited in its headers (the identity is checked before any
  // checksum): stream header 32 bytes, then the block's: group at +4, flags at +8.
  std::vector<unsigned char> twice = second;
  twice.insert(twice.end(), second.begin() + 32, second.end());
  twice[12] = 2;               // the block count
  for (int i = 0; i < 8; ++i)  // the stream's length
    twice[16 + i] = static_cast<unsigned char>(twice.size() >> (8 * i));
  fails(twice, "holds 2 blocks; expected one");
  std::vector<unsigned char> keyless = second;
  keyless[32 + 8] &= static_cast<unsigned char>(~1u);
  fails(keyless, "holds a block without a prefix identity");
  std::vector<unsigned char> other_group = second;
  other_group[32 + 4] = 77;
  fails(other_group, "holds a block of group 77");
  std::vector<unsigned char> other_kind = second;
  other_kind[32 + 8] ^= 2u;
  fails(other_kind, "holds a state checkpoint; expected a block of tokens");
  ASSERT_TRUE(host.Evict(loads[1].key).ok());
  ASSERT_TRUE(host.Put(loads[1].key, second).ok());

  // A miss: the entry is gone.
  ASSERT_TRUE(host.Evict(loads[1].key).ok());
  EXPECT_FALSE(b.connector->Has(loads[1].key));
  ASSERT_TRUE(b.connector->StartLoad(1, loads).ok());
  EXPECT_EQ(b.connector->Wait(1), TierConnector::LoadState::kFailed);
  b.connector->Forget(1);
  ASSERT_TRUE(b.manager.FinishLoad(1, false).ok());
  EXPECT_TRUE(b.manager.CheckInvariants().ok());
  EXPECT_EQ(b.connector->Poll(1), TierConnector::LoadState::kFailed);  // no job: failed
}

TEST(TierConnectorTest, BadCallsAreRefusedByName) {
  HostTier host(int64_t{1} << 20);
  const Plan plan = PlanOf(Gemma2Like(), TensorLayout::kCanonical, PageStrategy::kAuto);
  PlanMemory memory(plan, 3);
  const BlockMemoryView view = memory.View(plan);
  EXPECT_EQ(TierConnector::Create(view, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TierConnector::Create(view, {&host, nullptr}).status().code(),
            StatusCode::kInvalidArgument);
  auto c = TierConnector::Create(view, {&host}).value();
  EXPECT_EQ(c->StartLoad(1, {}).code(), StatusCode::kInvalidArgument);
  const auto refused = [](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  const BlockLoad bad_block{0, view.group(0).pool, 1 << 30, {}, false};
  refused(c->StartLoad(1, {&bad_block, 1}), "load into block 1073741824 of group 0: outside pool");
  const BlockLoad bad_group{99, 0, 1, {}, false};
  refused(c->StartLoad(1, {&bad_group, 1}), "names group 99; the memory view has");
  const BlockLoad bad_pool{0, view.num_pools(), 1, {}, false};
  refused(c->StartLoad(1, {&bad_pool, 1}),
          "names pool " + std::to_string(view.num_pools()) + "; the group's blocks are of pool");
  EXPECT_FALSE(c->HasJob(1));
  // A bad stored event stores nothing, not even the good events before it.
  ManagerEvent good{KvEvent::Kind::kStored, view.group(0).pool, 0, BlockHash{1, 2}, 1};
  ManagerEvent bad{KvEvent::Kind::kStored, 0, 42, BlockHash{3, 4}, 1};
  refused(c->Store(std::vector<ManagerEvent>{good, bad}),
          "stored event for block 1 names group 42");
  ManagerEvent outside{KvEvent::Kind::kStored, view.group(0).pool, 0, BlockHash{3, 4}, 1 << 30};
  refused(c->Store(std::vector<ManagerEvent>{good, outside}),
          "stored event for block 1073741824 of group 0: outside pool");
  EXPECT_EQ(host.used_bytes(), 0);
  EXPECT_EQ(c->stats().blocks_stored, 0);
}

TEST(TierConnectorTest, CancelStopsAJobAndTheDestructorJoinsWithJobsQueued) {
  HostTier host(int64_t{64} << 20);
  Side a(MambaHybrid(), 1, {&host});
  a.Add(1, Prompt(100));
  ASSERT_TRUE(a.manager.Allocate(1, 100).ok());
  ASSERT_TRUE(a.manager.Commit(1, 100).ok());
  ASSERT_TRUE(a.connector->Store(a.manager.TakeEvents()).ok());
  auto b = std::make_unique<Side>(MambaHybrid(), 2, std::vector<Tier*>{&host});
  std::vector<BlockLoad> loads;
  for (RequestId id = 1; id <= 3; ++id) {
    b->Add(id, Prompt(100));
    const PrefixHit hit = b->manager.Lookup(id, *b->connector).value();
    ASSERT_GT(hit.loads, 0);
    ASSERT_TRUE(b->manager.Allocate(id, 100 - hit.tokens, hit).ok());
    const StepInfo step = b->manager.Step(id).value();
    ASSERT_TRUE(b->connector->StartLoad(id, step.loads).ok());
  }
  b->connector->Cancel(2);
  const TierConnector::LoadState state = b->connector->Poll(2);
  EXPECT_NE(state, TierConnector::LoadState::kPending);
  b->connector->Forget(2);
  ASSERT_TRUE(b->manager.Free(2).ok());
  EXPECT_TRUE(b->manager.CheckInvariants().ok());
  b.reset();  // jobs 1 and 3 may still be queued or running
}

}  // namespace
}  // namespace hkv::testing
