// ManagerConfig::admission_headroom_steps: a request's first Allocate, while others have started,
// must also leave what the started requests' decoder token groups need for that many more decode
// steps; a running request's own steps, and an admission with nothing started, need none. A
// refusal changes nothing; what the headroom alone held back is counted.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

// One full-attention group of 4-token blocks, 10 usable blocks; with `steps` of headroom each
// started request keeps ceil(steps * started / 4) blocks free at an admission.
ManagerConfig Small(int32_t steps, std::vector<GroupConfig> groups = {Full(4)}) {
  ManagerConfig c = MakeConfig({11}, std::move(groups));
  c.admission_headroom_steps = steps;
  return c;
}

int32_t FreeBlocks(const KvCacheManager& m) {
  return m.Usage(0).num_free;
}

// Two 16-token prompts (4 blocks each) run; a third request of 4 tokens asks for one block while
// two are free. With 4 steps of headroom the two running requests keep 2 blocks: refused, and
// nothing changed. Without headroom it is admitted.
TEST(AdmissionHeadroom, AnAdmissionLeavesTheRunningRequestsTheirNextSteps) {
  for (const int32_t steps : {0, 4}) {
    SCOPED_TRACE(steps);
    Driver d(Small(steps));
    d.Add(1, Seq(16, 100));
    d.Prefill(1);  // nothing started: no headroom needed
    d.Add(2, Seq(16, 200));
    d.Prefill(2);  // 4 blocks + 1 kept for request 1 <= 6 free
    EXPECT_EQ(FreeBlocks(d.m()), 2);
    d.Add(3, Seq(4, 300));
    const PrefixHit hit = d.Lookup(3);
    const Status s = d.m().Allocate(3, 4, hit);
    if (steps == 0) {
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(d.m().stats().admissions_held_for_headroom, 0);
      continue;
    }
    ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_NE(s.message().find("admission_headroom_steps"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("2 running requests"), std::string::npos) << s.message();
    d.Check();
    EXPECT_EQ(FreeBlocks(d.m()), 2);
    EXPECT_EQ(d.m().stats().admissions_held_for_headroom, 1);
    EXPECT_EQ(d.m().stats().allocations_failed, 1);
    // A running request's own step takes from the headroom: it is what the headroom is for.
    for (int32_t t = 0; t < 4; ++t)
      d.Decode(1, 900 + t);  // to 20 tokens: a fifth block
    EXPECT_EQ(FreeBlocks(d.m()), 1);
    // Once request 1 ends, its blocks are free (cached) and one request keeps one block.
    d.Free(1);
    const PrefixHit again = d.Lookup(3);
    ASSERT_TRUE(d.m().Allocate(3, 4, again).ok());
    d.Check();
  }
}

// The headroom is counted per decoder token group drawing from the pool, in that group's
// blocks: with a full-attention group of 4-token blocks and a 16-token window group of 8-token
// blocks, two started requests keep ceil(8 / 4) + ceil(8 / 8) = 3 blocks at 4 steps. Of 8 free
// blocks, a 12-token prompt (3 + 2 blocks) is admitted and a 16-token one (4 + 2) is refused; a
// headroom counted for the full-attention group alone (2) would have admitted it.
TEST(AdmissionHeadroom, EachGrowingGroupKeepsItsOwnBlocks) {
  for (const int32_t prompt : {12, 16}) {
    SCOPED_TRACE(prompt);
    ManagerConfig c = MakeConfig({15}, {Full(4), Window(16, 8)});
    c.admission_headroom_steps = 4;
    Driver d(c);
    d.Add(1, Seq(8, 100));
    d.Prefill(1);  // 2 + 1 blocks
    d.Add(2, Seq(8, 200));
    d.Prefill(2);  // 2 + 1 blocks, with 1 + 1 kept for request 1
    EXPECT_EQ(FreeBlocks(d.m()), 8);
    d.Add(3, Seq(prompt, 300));
    const Status s = d.m().Allocate(3, prompt, d.Lookup(3));
    d.Check();
    if (prompt == 12) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(FreeBlocks(d.m()), 3);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
      EXPECT_EQ(FreeBlocks(d.m()), 8);
    }
  }
}

// A request forked from a started one is started: the next admission keeps headroom for it too.
TEST(AdmissionHeadroom, ForkedRequestsCountAsRunning) {
  Driver d(Small(4));
  d.Add(1, Seq(16, 100));
  d.Prefill(1);
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Check();
  // 6 free; two started requests keep 2: an admission of 5 blocks is refused, of 4 admitted.
  d.Add(3, Seq(20, 300));
  ASSERT_EQ(d.m().Allocate(3, 20, d.Lookup(3)).code(), StatusCode::kResourceExhausted);
  d.Check();
  d.Add(4, Seq(16, 400));
  ASSERT_TRUE(d.m().Allocate(4, 16, d.Lookup(4)).ok());
  d.Check();
  // Freeing the fork and the admitted request: the count follows (the checker compares it).
  ASSERT_TRUE(d.m().Free(2).ok());
  ASSERT_TRUE(d.m().Free(4).ok());
  d.Check();
}

TEST(AdmissionHeadroom, ConfigOutOfRangeIsRefused) {
  ManagerConfig c = Small(-1);
  Status s = c.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("admission_headroom_steps -1"), std::string::npos) << s.message();
  c.admission_headroom_steps = static_cast<int32_t>(c.max_model_len) + 1;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  c.admission_headroom_steps = static_cast<int32_t>(c.max_model_len);
  EXPECT_TRUE(c.Validate().ok());
}

}  // namespace
}  // namespace hkv::testing
