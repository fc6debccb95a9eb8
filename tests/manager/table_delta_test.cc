// TakeTableDelta: an engine that keeps block tables on its side receives only what changed.
// (Every FakeEngine run also rebuilds each table from deltas alone and compares it with
// BlockTable, so the random and fuzz tests check the deltas under every operation.)
#include <gtest/gtest.h>

#include <hkv/manager/kv_cache_manager.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

std::vector<int32_t> Blocks(const TableDelta& d) {
  return {d.blocks.begin(), d.blocks.end()};
}

TEST(TableDelta, FirstTakeIsTheWholeTableThenOnlyAppendedBlocks) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(10));
  d.Run(1, 10);  // blocks for positions [0, 10): three
  TableDelta first = d.m().TakeTableDelta(1, 0).value();
  EXPECT_EQ(first.size, 3);
  EXPECT_EQ(first.from, 0);
  EXPECT_EQ(Blocks(first), d.Table(1, 0));

  d.Decode(1, 7);  // position 10 lands in block 2: nothing changes
  TableDelta none = d.m().TakeTableDelta(1, 0).value();
  EXPECT_EQ(none.size, 3);
  EXPECT_EQ(none.from, 3);
  EXPECT_TRUE(none.blocks.empty());

  d.Decode(1, 8);
  d.Decode(1, 9);  // position 12 opens block 3
  TableDelta one = d.m().TakeTableDelta(1, 0).value();
  EXPECT_EQ(one.size, 4);
  EXPECT_EQ(one.from, 3);
  ASSERT_EQ(one.blocks.size(), 1u);
  EXPECT_EQ(one.blocks[0], d.Table(1, 0)[3]);
}

TEST(TableDelta, CopyOnWriteAndTruncateReportTheEntriesTheyChange) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(10));
  d.Run(1, 10);
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  // The child's first take is all of it; its next step writes into the shared block 2.
  EXPECT_EQ(d.m().TakeTableDelta(2, 0).value().from, 0);
  const int32_t shared = d.Table(2, 0)[2];
  d.Decode(2, 5);
  TableDelta cow = d.m().TakeTableDelta(2, 0).value();
  EXPECT_EQ(cow.from, 2);
  ASSERT_EQ(cow.blocks.size(), 1u);
  EXPECT_NE(cow.blocks[0], shared);
  EXPECT_EQ(cow.blocks[0], d.Table(2, 0)[2]);

  ASSERT_TRUE(d.m().TakeTableDelta(1, 0).ok());
  ASSERT_TRUE(d.m().Truncate(1, 4).ok());
  d.Check();
  TableDelta cut = d.m().TakeTableDelta(1, 0).value();
  EXPECT_EQ(cut.size, 1);
  EXPECT_EQ(cut.from, 1);  // block 0 is as taken; the rest is gone
}

TEST(TableDelta, RefusesStateGroupsUnknownRequestsAndGroupsOutOfRange) {
  Driver d(MakeConfig({64}, {Full(4), StateGroup()}));
  d.Add(1, Seq(8));
  d.Run(1, 8);
  Result<TableDelta> state = d.m().TakeTableDelta(1, 1);
  EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("state group"), std::string::npos);
  EXPECT_EQ(d.m().TakeTableDelta(9, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.m().TakeTableDelta(1, 2).status().code(), StatusCode::kInvalidArgument);
  // A refused call takes nothing: the table is still reported whole.
  EXPECT_EQ(d.m().TakeTableDelta(1, 0).value().from, 0);
}

// TakeStepInputs gives, in one call, what Step, TakeTableDelta, State and SlotMapping give
// separately; rebuilt from its deltas alone, every table equals BlockTable wherever the group
// keeps a block.
TEST(StepInputs, EqualTheSeparateViewsOnEveryKindStepAfterStep) {
  ManagerConfig c = MakeConfig({256}, {Full(4), Window(8, 4), Encoder(4), StateGroup()});
  Driver d(c);
  RequestSpec spec;
  spec.encoder_tokens = 6;
  d.Add(1, Seq(21), spec);
  std::vector<std::vector<int32_t>> mirror(c.groups.size());
  StepInputs in;
  for (int step = 0; step < 12; ++step) {
    const int64_t n = step == 0 ? 21 : 1;
    if (step > 0) {
      const int32_t token = 500 + step;
      ASSERT_TRUE(d.m().AppendTokens(1, {&token, 1}).ok());
    }
    ASSERT_TRUE(d.m().Allocate(1, n).ok());
    ASSERT_TRUE(d.m().TakeStepInputs(1, in).ok());
    const StepInfo info = d.m().Step(1).value();
    EXPECT_EQ(in.step.begin, info.begin);
    EXPECT_EQ(in.step.end, info.end);
    ASSERT_EQ(in.tables.size(), c.groups.size());
    std::vector<int64_t> slots;
    for (int32_t g = 0; g < static_cast<int32_t>(c.groups.size()); ++g) {
      const auto gi = static_cast<size_t>(g);
      if (c.groups[gi].is_state()) {
        const StateStep st = d.m().State(1, g).value();
        EXPECT_EQ(in.states[gi].read, st.read);
        EXPECT_EQ(in.states[gi].write, st.write);
        EXPECT_EQ(in.states[gi].snapshots.size(), st.snapshots.size());
        EXPECT_TRUE(in.tables[gi].blocks.empty());
        continue;
      }
      const TableDelta& delta = in.tables[gi];
      mirror[gi].resize(static_cast<size_t>(delta.size));
      std::copy(delta.blocks.begin(), delta.blocks.end(), mirror[gi].begin() + delta.from);
      const std::vector<int32_t> table = d.Table(1, g);
      ASSERT_EQ(mirror[gi].size(), table.size()) << "group " << g << " step " << step;
      for (size_t j = 0; j < table.size(); ++j) {
        if (table[j] != 0) {
          EXPECT_EQ(mirror[gi][j], table[j]) << "group " << g << " entry " << j;
        }
      }
      if (!c.groups[gi].is_encoder()) {
        ASSERT_TRUE(d.m().SlotMapping(1, g, info.begin, info.end, slots).ok());
      }
    }
    EXPECT_EQ(in.slots, slots) << "step " << step;
    ASSERT_TRUE(d.m().Commit(1, info.end).ok());
    d.Check();
  }
  // Without an open step nothing is taken.
  EXPECT_EQ(d.m().TakeStepInputs(1, in).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.m().TakeStepInputs(2, in).code(), StatusCode::kNotFound);
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  const StepInfo info = d.m().Step(1).value();
  ASSERT_TRUE(d.m().TakeStepInputs(1, in).ok());
  EXPECT_EQ(in.step.end, info.end);
}

}  // namespace
}  // namespace hkv::testing
