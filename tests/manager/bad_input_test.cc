// Bad input: every refused call names what was wrong and leaves the manager exactly as it was.
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

struct Snapshot {
  std::vector<std::vector<int32_t>> free_lists;
  std::vector<int32_t> cached;
  int32_t requests = 0;
  std::vector<int64_t> computed, tokens;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Take(KvCacheManager& m, std::initializer_list<RequestId> ids) {
  Snapshot s;
  for (int32_t p = 0; p < static_cast<int32_t>(m.config().pool_blocks.size()); ++p) {
    s.free_lists.push_back(ManagerProbe::FreeListOrder(m, p));
    s.cached.push_back(m.Usage(p).num_cached);
  }
  s.requests = m.num_requests();
  for (RequestId id : ids) {
    if (!m.Contains(id)) continue;
    s.computed.push_back(m.NumComputed(id).value());
    s.tokens.push_back(m.NumTokens(id).value());
  }
  return s;
}

class BadInput : public ::testing::Test {
 protected:
  BadInput() : d_(Config()) {
    d_.Add(1, Seq(10));
    d_.Prefill(1);
    d_.Add(2, Seq(6, 300));
  }
  static ManagerConfig Config() {
    ManagerConfig c = MakeConfig({32, 16}, {Full(4, 0), StateGroup(1)}, 64);
    return c;
  }
  // Runs a refused call and checks its code, its message and that nothing changed.
  void Refused(StatusCode code, const std::string& needle, const std::function<Status()>& call) {
    const Snapshot before = Take(d_.m(), {1, 2});
    const Status s = call();
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    d_.Check();
    EXPECT_TRUE(Take(d_.m(), {1, 2}) == before) << needle;
  }
  Driver d_;
};

TEST_F(BadInput, UnknownRequests) {
  auto& m = d_.m();
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Lookup(9).status(); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Allocate(9, 1); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Commit(9, 1); });
  Refused(StatusCode::kNotFound, "unknown request 9",
          [&] { return m.AppendTokens(9, std::vector<int32_t>{1}); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Truncate(9, 0).status(); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Fork(9, 10); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.Step(9).status(); });
  Refused(StatusCode::kNotFound, "unknown request 9", [&] { return m.BlockTable(9, 0).status(); });
  EXPECT_FALSE(m.Contains(9));
}

TEST_F(BadInput, DoubleFree) {
  d_.Free(2);
  Refused(StatusCode::kNotFound, "already freed", [&] { return d_.m().Free(2); });
}

TEST_F(BadInput, AllocateBeyondMaxModelLength) {
  Refused(StatusCode::kInvalidArgument, "exceed max_model_len",
          [&] { return d_.m().Allocate(2, 65); });
  Refused(StatusCode::kInvalidArgument, "exceed max_model_len",
          [&] { return d_.m().Allocate(2, 6, {}, 59); });
  Refused(StatusCode::kInvalidArgument, "expected >= 1", [&] { return d_.m().Allocate(2, 0); });
  Refused(StatusCode::kInvalidArgument, "negative lookahead",
          [&] { return d_.m().Allocate(2, 1, {}, -1); });
  Refused(StatusCode::kInvalidArgument, "beyond max_model_len",
          [&] { return d_.m().AppendTokens(1, std::vector<int32_t>(60, 1)); });
}

TEST_F(BadInput, HitsThatLookupCouldNotHaveReturned) {
  Refused(StatusCode::kInvalidArgument,
          "not one Lookup could return: tokens not a multiple of the alignment 4", [&] {
            return d_.m().Allocate(2, 1, PrefixHit{3, false});
          });
  Refused(StatusCode::kInvalidArgument, "not one Lookup could return: negative tokens", [&] {
    return d_.m().Allocate(2, 1, PrefixHit{-4, false});
  });
  Refused(StatusCode::kInvalidArgument, "not one Lookup could return: negative loads", [&] {
    return d_.m().Allocate(2, 1, PrefixHit{4, false, -1});
  });
  Refused(StatusCode::kInvalidArgument, "not one Lookup could return: loads without hit tokens",
          [&] {
            return d_.m().Allocate(2, 1, PrefixHit{0, false, 1});
          });
  Refused(StatusCode::kFailedPrecondition, "went stale", [&] {
    return d_.m().Allocate(2, 1, PrefixHit{8, false});
  });  // prompt is 6
  Refused(StatusCode::kInvalidArgument, "encoder hit on a model without a cross-attention group",
          [&] {
            return d_.m().Allocate(2, 1, PrefixHit{0, true});
          });
  Refused(StatusCode::kFailedPrecondition, "first Allocate", [&] {
    return d_.m().Allocate(1, 1, PrefixHit{4, false});
  });
  Refused(StatusCode::kFailedPrecondition, "already allocated",
          [&] { return d_.m().Lookup(1).status(); });
}

// Without prefix caching Lookup finds nothing: neither decoder tokens nor the encoder's blocks.
TEST(BadInputWithoutPrefixCaching, HitsAreRefusedByWhatTheyClaim) {
  ManagerConfig c = MakeConfig({32}, {Full(4), Encoder(4)}, 64);
  c.enable_prefix_caching = false;
  Driver d(c);
  RequestSpec spec;
  spec.id = 1;
  const std::vector<int32_t> prompt = Seq(10);
  spec.prompt = prompt;
  spec.encoder_tokens = 8;
  ASSERT_TRUE(d.m().AddRequest(spec).ok());
  const std::vector<int32_t> free_before = ManagerProbe::FreeListOrder(d.m(), 0);
  const auto refused = [&](const PrefixHit& hit, const std::string& what) {
    const Status s = d.m().Allocate(1, 1, hit);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 0), free_before);
    EXPECT_EQ(d.m().NumComputed(1).value(), 0);
    d.Check();
  };
  refused(PrefixHit{4, false}, "not one Lookup could return: hit tokens with prefix caching off");
  refused(PrefixHit{0, true}, "encoder hit with prefix caching off");
}

TEST_F(BadInput, StaleHitIsRefusedAndNothingIsTaken) {
  // Request 3 would hit request 1's blocks; they do not exist under request 2's tokens.
  d_.Add(3, Seq(10, 300));
  Refused(StatusCode::kFailedPrecondition, "went stale", [&] {
    return d_.m().Allocate(3, 2, PrefixHit{8, false});
  });
}

TEST_F(BadInput, StepsOutOfOrder) {
  auto& m = d_.m();
  Refused(StatusCode::kFailedPrecondition, "no open step", [&] { return m.Commit(1, 10); });
  Refused(StatusCode::kFailedPrecondition, "no open step", [&] { return m.Step(1).status(); });
  ASSERT_TRUE(m.Allocate(2, 6).ok());
  Refused(StatusCode::kFailedPrecondition, "already has an open step",
          [&] { return m.Allocate(2, 1); });
  Refused(StatusCode::kInvalidArgument, "outside the step", [&] { return m.Commit(2, 7); });
  Refused(StatusCode::kFailedPrecondition, "open step", [&] { return m.Truncate(2, 1).status(); });
  Refused(StatusCode::kFailedPrecondition, "open step", [&] { return m.Fork(2, 5); });
  ASSERT_TRUE(m.Commit(2, 6).ok());
}

TEST_F(BadInput, TruncateAndForkOutOfRange) {
  auto& m = d_.m();
  Refused(StatusCode::kInvalidArgument, "cannot keep 11 tokens",
          [&] { return m.Truncate(1, 11).status(); });
  Refused(StatusCode::kInvalidArgument, "cannot keep -1 tokens",
          [&] { return m.Truncate(1, -1).status(); });
  Refused(StatusCode::kInvalidArgument, "child id is already in use", [&] { return m.Fork(1, 2); });
  Refused(StatusCode::kNotFound, "unknown request 42", [&] { return m.Fork(42, 43); });
}

TEST_F(BadInput, MalformedRequests) {
  auto& m = d_.m();
  const auto prompt = Seq(5);
  RequestSpec dup;
  dup.id = 1;
  dup.prompt = prompt;
  Refused(StatusCode::kInvalidArgument, "already in use", [&] { return m.AddRequest(dup); });
  RequestSpec empty;
  empty.id = 7;
  Refused(StatusCode::kInvalidArgument, "empty prompt", [&] { return m.AddRequest(empty); });
  const auto long_prompt = Seq(65);
  RequestSpec too_long;
  too_long.id = 7;
  too_long.prompt = long_prompt;
  Refused(StatusCode::kInvalidArgument, "exceeds max_model_len",
          [&] { return m.AddRequest(too_long); });
  const PromptItem outside{{1, 1}, 3, 4};
  RequestSpec bad_item;
  bad_item.id = 7;
  bad_item.prompt = prompt;
  bad_item.items = {&outside, 1};
  Refused(StatusCode::kInvalidArgument, "outside the prompt",
          [&] { return m.AddRequest(bad_item); });
  const PromptItem empty_item{{1, 1}, 2, 0};
  bad_item.items = {&empty_item, 1};
  Refused(StatusCode::kInvalidArgument, "item 0 has length 0: expected >= 1",
          [&] { return m.AddRequest(bad_item); });
  RequestSpec encoder;
  encoder.id = 7;
  encoder.prompt = prompt;
  encoder.encoder_tokens = 4;
  Refused(StatusCode::kInvalidArgument, "no cross-attention group",
          [&] { return m.AddRequest(encoder); });
  const std::vector<int32_t> negative{1, -2};
  RequestSpec neg;
  neg.id = 7;
  neg.prompt = negative;
  Refused(StatusCode::kInvalidArgument, "negative", [&] { return m.AddRequest(neg); });
}

TEST_F(BadInput, ViewsOfGroupsOutOfRangeOrOfTheWrongKind) {
  auto& m = d_.m();
  ASSERT_TRUE(m.Allocate(2, 6).ok());
  std::vector<int64_t> slots;
  Refused(StatusCode::kInvalidArgument, "out of range",
          [&] { return m.BlockTable(2, 5).status(); });
  Refused(StatusCode::kInvalidArgument, "state group", [&] { return m.BlockTable(2, 1).status(); });
  Refused(StatusCode::kInvalidArgument, "not a state group",
          [&] { return m.State(2, 0).status(); });
  Refused(StatusCode::kInvalidArgument, "outside the reserved",
          [&] { return m.SlotMapping(2, 0, 4, 9, slots); });
  Refused(StatusCode::kInvalidArgument, "positions [5, 3) of request 2 group 0: end before begin",
          [&] { return m.SlotMapping(2, 0, 5, 3, slots); });
  EXPECT_TRUE(slots.empty());
  // Into a caller's buffer: its size must match the range; on error nothing is written.
  std::vector<int64_t> buffer(5, -7);
  Refused(StatusCode::kInvalidArgument, "an output of 5 slots for the 4 positions",
          [&] { return m.SlotMapping(2, 0, 1, 5, std::span<int64_t>(buffer)); });
  Refused(StatusCode::kInvalidArgument, "outside the reserved",
          [&] { return m.SlotMapping(2, 0, 4, 9, std::span<int64_t>(buffer)); });
  EXPECT_EQ(buffer, std::vector<int64_t>(5, -7));
  ASSERT_TRUE(m.SlotMapping(2, 0, 1, 6, std::span<int64_t>(buffer)).ok());
  ASSERT_TRUE(m.SlotMapping(2, 0, 1, 6, slots).ok());
  EXPECT_EQ(buffer, slots);
  ASSERT_TRUE(m.Commit(2, 6).ok());
}

TEST_F(BadInput, ResetWhileBlocksAreHeld) {
  Refused(StatusCode::kFailedPrecondition, "free every request first",
          [&] { return d_.m().ResetPrefixCache(); });
}

}  // namespace
}  // namespace hkv::testing
