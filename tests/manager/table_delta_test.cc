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

}  // namespace
}  // namespace hkv::testing
