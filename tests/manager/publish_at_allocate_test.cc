// ManagerConfig::publish_at_allocate: a step's full blocks of known tokens are published when it
// is allocated, so a request looked up while the step is open (later in the same batch) hits
// them; what another request holds that way cannot be taken back by a short Commit or a Free.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/kv_cache_manager.h>

#include "manager_test_util.h"

namespace hkv {
namespace {

using testing::Concat;
using testing::Driver;
using testing::Full;
using testing::MakeConfig;
using testing::Seq;
using testing::StateGroup;
using testing::Window;

ManagerConfig Publishing(ManagerConfig c, bool on = true) {
  c.publish_at_allocate = on;
  return c;
}

int64_t Removed(const std::vector<ManagerEvent>& events) {
  return std::count_if(events.begin(), events.end(),
                       [](const ManagerEvent& e) { return e.kind == KvEvent::Kind::kRemoved; });
}

// Request 1 opens a step over a 20-token prompt: blocks 0..4 (4 tokens each) complete in it.
void OpenTwentyTokenStep(Driver& d) {
  d.Add(1, Seq(20));
  ASSERT_TRUE(d.m().Allocate(1, 20).ok());
}

TEST(PublishAtAllocate, ALaterRequestHitsTheOpenStepsBlocks) {
  for (bool on : {false, true}) {
    Driver d(Publishing(MakeConfig({64}, {Full(4)}), on));
    ASSERT_NO_FATAL_FAILURE(OpenTwentyTokenStep(d));
    d.Add(2, Concat(Seq(20), Seq(6, 900)));
    // Published at Allocate: hit on all five; at Commit: nothing yet.
    EXPECT_EQ(d.Lookup(2).tokens, on ? 20 : 0) << on;
    d.Check();
  }
}

TEST(PublishAtAllocate, WindowsAndFullAttentionBothPublishTheStep) {
  // A hit at 16 needs full attention's blocks 0..3 and the window's last two (span 8).
  Driver d(Publishing(MakeConfig({64}, {Window(8, 4), Full(4)})));
  d.Add(1, Seq(18));
  ASSERT_TRUE(d.m().Allocate(1, 18).ok());
  d.Add(2, Concat(Seq(16), Seq(5, 900)));
  EXPECT_EQ(d.Lookup(2).tokens, 16);
}

TEST(PublishAtAllocate, ALentStepCannotBeCutShortOrFreedUntilTheBorrowerLetsGo) {
  Driver d(Publishing(MakeConfig({64}, {Full(4)})));
  ASSERT_NO_FATAL_FAILURE(OpenTwentyTokenStep(d));
  d.Add(2, Concat(Seq(12), Seq(6, 900)));
  const PrefixHit hit = d.Lookup(2);
  ASSERT_EQ(hit.tokens, 12);
  ASSERT_TRUE(d.m().Allocate(2, 6, hit).ok());  // holds blocks 0..2 of request 1's open step
  d.m().TakeEvents();
  const PoolUsage before = d.m().Usage(0);
  // Committing request 1 at 8 would withdraw block 2, which request 2 reads in this batch.
  Status s = d.m().Commit(1, 8);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("commit: request 1: block 2 of group 0"), std::string::npos)
      << s.message();
  s = d.m().Free(1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("free: request 1"), std::string::npos) << s.message();
  // Refused, nothing changed.
  EXPECT_EQ(d.m().Usage(0).num_cached, before.num_cached);
  EXPECT_EQ(d.m().Usage(0).num_free, before.num_free);
  EXPECT_TRUE(d.m().TakeEvents().empty());
  EXPECT_EQ(d.m().NumComputed(1).value(), 0);
  d.Check();
  // Past the lent blocks the step may still be cut: at 12 only blocks 3 and 4 are withdrawn.
  d.Free(2);
  d.m().TakeEvents();
  ASSERT_TRUE(d.m().Commit(1, 12).ok());
  EXPECT_EQ(Removed(d.m().TakeEvents()), 2);
  d.Check();
  d.Add(3, Seq(20));
  EXPECT_EQ(d.Lookup(3).tokens, 12);
}

TEST(PublishAtAllocate, FreeingAnOpenStepWithdrawsWhatItPublished) {
  Driver d(Publishing(MakeConfig({64}, {Full(4)})));
  ASSERT_NO_FATAL_FAILURE(OpenTwentyTokenStep(d));
  EXPECT_EQ(d.m().Usage(0).num_cached, 5);
  d.m().TakeEvents();
  d.Free(1);
  EXPECT_EQ(Removed(d.m().TakeEvents()), 5);
  EXPECT_EQ(d.m().Usage(0).num_cached, 0);
  d.Add(2, Seq(20));
  EXPECT_EQ(d.Lookup(2).tokens, 0);
}

TEST(PublishAtAllocate, ACommittedStepKeepsItsBlocksAndCommitsNothingTwice) {
  Driver d(Publishing(MakeConfig({64}, {Full(4)})));
  ASSERT_NO_FATAL_FAILURE(OpenTwentyTokenStep(d));
  const auto at_allocate = d.m().TakeEvents();
  EXPECT_EQ(at_allocate.size(), 5u);  // five stored events, before the step ran
  ASSERT_TRUE(d.m().Commit(1, 20).ok());
  EXPECT_TRUE(d.m().TakeEvents().empty());
  d.Free(1);
  d.Add(2, Concat(Seq(20), Seq(3, 900)));
  EXPECT_EQ(d.Lookup(2).tokens, 20);
}

TEST(PublishAtAllocate, RecurrentModelsPublishAtCommit) {
  // A hit needs a state at its position, which only a step that has run leaves.
  Driver d(Publishing(MakeConfig({64, 8}, {Full(4, 0), StateGroup(1)})));
  d.Add(1, Seq(20));
  ASSERT_TRUE(d.m().Allocate(1, 20).ok());
  EXPECT_EQ(d.m().Usage(0).num_cached, 0);
  d.Add(2, Concat(Seq(20), Seq(3, 900)));
  EXPECT_EQ(d.Lookup(2).tokens, 0);
}

}  // namespace
}  // namespace hkv
