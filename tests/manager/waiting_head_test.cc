// A waiting head retried every step while memory is full: when the blocks its first step needs
// besides its hit already exceed the free blocks, it is refused from arithmetic (the message
// says "at least"), changing nothing, exactly when the full plan would refuse it; a hit that went
// stale since its Lookup, or windows that could be given back, still go through the full plan.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

int32_t FreeBlocks(const KvCacheManager& m) {
  return m.Usage(0).num_free;
}

// 10 usable blocks of 4 tokens. A 32-token request holds 8; a new 16-token prompt needs 4 fresh
// blocks with 2 free: refused from arithmetic, every retry alike. Once the first request ends it
// is admitted, as the full plan would.
TEST(WaitingHead, ShortOfFreshBlocksIsRefusedFromArithmetic) {
  Driver d(MakeConfig({11}, {Full(4)}));
  d.Add(1, Seq(32, 100));
  d.Prefill(1);
  EXPECT_EQ(FreeBlocks(d.m()), 2);
  d.Add(2, Seq(16, 500));
  for (int retry = 0; retry < 3; ++retry) {
    const Status s = d.m().Allocate(2, 16, d.Lookup(2));
    ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_NE(s.message().find("need at least 4 block(s)"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("pool 0 needs at least 4 free blocks, has 2"), std::string::npos)
        << s.message();
    d.Check();
    EXPECT_EQ(FreeBlocks(d.m()), 2);
    EXPECT_EQ(d.m().stats().allocations_failed, retry + 1);
  }
  d.Free(1);
  ASSERT_TRUE(d.m().Allocate(2, 16, d.Lookup(2)).ok());
  d.Check();
}

// The hit's cached blocks count as need only in the full plan: a head whose fresh blocks fit but
// whose free cached hit blocks do not is refused by the plan, with its exact need.
TEST(WaitingHead, FreshBlocksThatFitLeaveTheDecisionToThePlan) {
  Driver d(MakeConfig({11}, {Full(4)}));
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  d.Free(1);  // 4 cached blocks, free
  d.Add(2, Seq(24, 300));
  d.Prefill(2);  // 6 blocks: 4 free, of them the 4 cached ones
  d.Add(3, Concat(Seq(16, 100), Seq(16, 900)));
  const PrefixHit hit = d.Lookup(3);
  ASSERT_EQ(hit.tokens, 16);
  // 4 fresh blocks (<= 4 free) plus the 4 free hit blocks it must take: 8 > 4.
  const Status s = d.m().Allocate(3, 16, hit);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(s.message().find("at least"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("need 8 block(s)"), std::string::npos) << s.message();
  d.Check();
}

// A hit whose blocks were evicted after its Lookup is reported stale, short of blocks or not:
// the arithmetic refusal trusts only a hit no identity left a block since.
TEST(WaitingHead, AHitThatWentStaleIsReportedStale) {
  Driver d(MakeConfig({11}, {Full(4)}));
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  d.Free(1);
  d.Add(2, Concat(Seq(16, 100), Seq(32, 700)));
  const PrefixHit hit = d.Lookup(2);
  ASSERT_EQ(hit.tokens, 16);
  d.Add(3, Seq(40, 300));
  d.Prefill(3);  // all 10 blocks: the cached ones evicted
  EXPECT_EQ(FreeBlocks(d.m()), 0);
  const Status s = d.m().Allocate(2, 32, hit);
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("went stale"), std::string::npos) << s.message();
  d.Check();
}

// Truncate before the first Allocate, then other tokens appended: the hit the earlier Lookup
// returned names blocks of the old tokens. Allocating with it is refused as stale - short of
// blocks (a window model, 18 free) or not (full attention alone, plenty free) - and nothing is
// taken.
TEST(WaitingHead, AHitFromBeforeATruncateIsStale) {
  for (const bool window : {true, false}) {
    SCOPED_TRACE(window);
    Driver d(window ? MakeConfig({31}, {Full(4), Window(8, 4)}) : MakeConfig({200}, {Full(4)}));
    d.Add(1, Seq(16, 100));
    d.Prefill(1);
    d.Free(1);
    d.Add(3, Seq(40, 3000));
    d.Prefill(3);
    d.Add(2, Concat(Seq(16, 100), Seq(64, 900)));
    const PrefixHit hit = d.Lookup(2);
    ASSERT_EQ(hit.tokens, 16);
    ASSERT_TRUE(d.m().Truncate(2, 0).ok());
    const std::vector<int32_t> other = Seq(80, 5000);
    ASSERT_TRUE(d.m().AppendTokens(2, other).ok());
    const int32_t free = FreeBlocks(d.m());
    const Status s = d.m().Allocate(2, 64, hit);
    ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("went stale"), std::string::npos) << s.message();
    EXPECT_EQ(FreeBlocks(d.m()), free);
    EXPECT_EQ(d.m().stats().allocations_failed, 0);
    d.Check();
    // Looked up again, it hits nothing of the old prompt and is admitted or refused as memory
    // allows.
    EXPECT_EQ(d.Lookup(2).tokens, 0);
  }
}

}  // namespace
}  // namespace hkv::testing
