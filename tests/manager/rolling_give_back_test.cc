// Rolling recurrent states are cache, not need: short of state blocks, Allocate gives them back
// (its own shared with the live state, so its step writes in place; other requests' published as
// checkpoints) before it refuses, and a refusal takes every give-back back.
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

constexpr int32_t kStatePool = 1;

// 4-token alignment; `state_blocks` usable state blocks.
ManagerConfig Tight(int32_t state_blocks) {
  return MakeConfig({256, state_blocks + 1}, {Full(4, 0), StateGroup(kStatePool)});
}

int32_t FreeStates(const KvCacheManager& m) {
  return m.Usage(kStatePool).num_free;
}

TEST(RollingGiveBack, ARequestsOwnRollingStateLetsItsStepWriteInPlace) {
  Driver d(Tight(1));
  d.Add(1, Seq(3));
  d.Prefill(1);      // 3 tokens: the live state is the only state block
  d.Decode(1, 900);  // to 4 (aligned): the live state is also the rolling one
  EXPECT_EQ(d.m().stats().rolling_states_given_back, 0);
  // The next step would write elsewhere to keep the aligned state; with no block to spare the
  // rolling state is given back and the step writes in place.
  const int32_t token = 901;
  ASSERT_TRUE(d.m().AppendTokens(1, {&token, 1}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  d.Check();
  EXPECT_EQ(d.m().stats().rolling_states_given_back, 1);
  const Result<StateStep> st = d.m().State(1, kStatePool);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->read, st->write);
  ASSERT_TRUE(d.m().Commit(1, 5).ok());
  d.Check();
  for (int32_t t = 2; t < 9; ++t)
    d.Decode(1, 900 + t);  // to 12: the state at 8 is given back by the step after it
  EXPECT_EQ(d.m().stats().rolling_states_given_back, 2);
  d.Free(1);
  EXPECT_EQ(FreeStates(d.m()), 1);
}

// ManagerConfig::rolling_stride_after_give_back: once a request gave its rolling state back, the
// next aligned position no longer takes a second state page back at once; only multiples of the
// stride do. One state block, 4-token alignment, decoding to 17: without the stride the step after
// each of 4, 8, 12 and 16 gives the rolling state back (4 times); with a stride of 16 only the
// steps after 4 (before any give-back) and 16 do, and the steps after 8 and 12 write in place
// without asking for a block.
TEST(RollingGiveBack, AfterAGiveBackRollingStatesAreKeptOnlyAtTheStride) {
  for (const int64_t stride : {int64_t{0}, int64_t{16}}) {
    ManagerConfig c = Tight(1);
    c.rolling_stride_after_give_back = stride;
    Driver d(c);
    d.Add(1, Seq(3));
    d.Prefill(1);
    for (int32_t t = 0; t < 14; ++t)
      d.Decode(1, 900 + t);  // to 17
    EXPECT_EQ(d.m().stats().rolling_states_given_back, stride == 0 ? 4 : 2) << stride;
    d.Free(1);
    EXPECT_EQ(FreeStates(d.m()), 1);
  }
}

TEST(RollingGiveBack, AnotherRequestsRollingStateIsPublishedAndFreesItsBlock) {
  Driver d(Tight(3));
  d.Add(1, Seq(3));
  d.Prefill(1);
  d.Decode(1, 900);  // 4: rolling = live
  d.Decode(1, 901);  // 5: written elsewhere, the state at 4 kept as the rolling one
  d.Add(2, Seq(3, 300));
  d.Prefill(2);
  ASSERT_EQ(FreeStates(d.m()), 0);
  d.m().TakeEvents();
  // Request 3 needs a state block: request 1's rolling state (at 4) is published as a checkpoint
  // and released, and request 3 takes its block.
  d.Add(3, Seq(3, 500));
  d.Prefill(3);
  EXPECT_EQ(d.m().stats().rolling_states_given_back, 1);
  std::vector<KvEvent::Kind> kinds;
  for (const ManagerEvent& e : d.m().TakeEvents()) {
    if (e.pool == kStatePool) kinds.push_back(e.kind);
  }
  EXPECT_EQ(kinds, (std::vector<KvEvent::Kind>{KvEvent::Kind::kStored, KvEvent::Kind::kRemoved}));
  // Request 1 goes on without it, and ends publishing nothing stale.
  d.Decode(1, 902);
  d.Free(1);
  d.Free(2);
  d.Free(3);
}

TEST(RollingGiveBack, ARefusalTakesEveryGiveBackBack) {
  Driver d(Tight(3));
  d.Add(1, Seq(3));
  d.Prefill(1);
  d.Decode(1, 900);
  d.Decode(1, 901);  // holds the live state and the rolling one
  d.Add(2, Seq(3, 300));
  d.Prefill(2);
  ASSERT_EQ(FreeStates(d.m()), 0);
  d.m().TakeEvents();
  // A 6-token prompt needs a state for its end and a snapshot at 4: two blocks, and only one can
  // be given back.
  d.Add(3, Seq(6, 500));
  const PrefixHit hit = d.Lookup(3);
  const Status st = d.m().Allocate(3, 6 - hit.tokens, hit);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  d.Check();
  EXPECT_EQ(d.m().stats().rolling_states_given_back, 0);
  EXPECT_EQ(FreeStates(d.m()), 0);
  // Nothing was published on the way: the give-back publishes only once an allocation fits.
  EXPECT_TRUE(d.m().TakeEvents().empty());
  // The rolling state is request 1's again, and it is what request 1's Free leaves for the next
  // turn.
  d.Free(1);
  d.Add(4, Concat(Concat(Seq(3), Seq(2, 900)), Seq(3, 50)));
  EXPECT_EQ(d.Lookup(4).tokens, 4);
  d.Free(2);
  d.Free(3);
  d.Free(4);
}

}  // namespace
}  // namespace hkv::testing
