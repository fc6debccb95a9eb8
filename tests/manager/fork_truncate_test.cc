// Fork (shared blocks, copy-on-write) and Truncate (coherent rollback in every group), and the
// speculative-decoding flow built from them.
#include <gtest/gtest.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

ManagerConfig Hybrid(int64_t interval = 0) {
  ManagerConfig c = MakeConfig({256, 64}, {Full(4, 0), StateGroup(1)});
  c.checkpoint_interval = interval;
  return c;
}

TEST(Fork, SharesBlocksAndCopiesThePartialBlockOnWrite) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(10));
  d.Prefill(1);
  const int32_t used = d.m().Usage(0).num_blocks - d.m().Usage(0).num_free;
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Check();
  EXPECT_EQ(d.Table(1, 0), d.Table(2, 0));
  EXPECT_EQ(d.m().Usage(0).num_blocks - d.m().Usage(0).num_free, used);  // nothing copied yet
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{7}).ok());
  ASSERT_TRUE(d.m().AppendTokens(2, std::vector<int32_t>{8}).ok());
  const auto shared = d.Table(1, 0);
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  const StepInfo s1 = d.m().Step(1).value();
  ASSERT_EQ(s1.copies.size(), 1u);
  EXPECT_EQ(s1.copies[0].src, shared[2]);
  EXPECT_EQ(s1.copies[0].dst, d.Table(1, 0)[2]);
  d.Check();
  // The other side is now the block's only holder and writes in place.
  ASSERT_TRUE(d.m().Allocate(2, 1).ok());
  EXPECT_TRUE(d.m().Step(2).value().copies.empty());
  EXPECT_EQ(d.Table(2, 0)[2], shared[2]);
  EXPECT_EQ(d.Table(1, 0)[0], d.Table(2, 0)[0]);
  ASSERT_TRUE(d.m().Commit(1, 11).ok());
  ASSERT_TRUE(d.m().Commit(2, 11).ok());
  d.Check();
  d.Free(1);
  d.Free(2);
  EXPECT_EQ(d.m().Usage(0).num_free, 63);
}

TEST(Fork, RecurrentStateIsCopiedOnWrite) {
  Driver d(Hybrid());
  d.Add(1, Seq(10));
  d.Prefill(1);
  ASSERT_TRUE(d.m().Fork(1, 2).ok());
  d.Check();
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{7}).ok());
  ASSERT_TRUE(d.m().AppendTokens(2, std::vector<int32_t>{8}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 1).ok());
  ASSERT_TRUE(d.m().Allocate(2, 1).ok());
  const StateStep a = d.m().State(1, 1).value(), b = d.m().State(2, 1).value();
  EXPECT_EQ(a.read, b.read);  // both continue from the shared state
  EXPECT_NE(a.write, a.read);
  EXPECT_NE(b.write, b.read);
  EXPECT_NE(a.write, b.write);
  ASSERT_TRUE(d.m().Commit(1, 11).ok());
  ASSERT_TRUE(d.m().Commit(2, 11).ok());
  d.Check();
}

TEST(Fork, ChildrenOfAForkHitTheSamePrefixAndDiverge) {
  Driver d(Hybrid(8));
  d.Add(1, Seq(20));
  d.Prefill(1);
  for (int k = 2; k <= 4; ++k)
    ASSERT_TRUE(d.m().Fork(1, static_cast<RequestId>(k)).ok());
  d.Check();
  for (int k = 1; k <= 4; ++k) {
    for (int32_t t = 0; t < 9; ++t)
      d.Decode(static_cast<RequestId>(k), 1000 * k + t);
  }
  for (int k = 1; k <= 4; ++k)
    d.Free(static_cast<RequestId>(k));
  EXPECT_EQ(d.m().Usage(0).num_free, 255);
  EXPECT_EQ(d.m().Usage(1).num_free, 63);
}

TEST(Truncate, IntoTheMiddleOfAPublishedBlockCopiesItOnTheNextWrite) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(20));
  d.Prefill(1);
  const auto before = d.Table(1, 0);
  const TruncateResult r = d.m().Truncate(1, 18).value();
  d.Check();
  EXPECT_EQ(r.tokens, 18);
  EXPECT_EQ(r.computed, 18);
  EXPECT_EQ(r.recompute, 0);
  EXPECT_EQ(d.Table(1, 0).size(), 5u);
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{1, 2}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 2).ok());
  const StepInfo s = d.m().Step(1).value();
  ASSERT_EQ(s.copies.size(), 1u);  // block 4 is cached under the old tokens: never overwrite it
  EXPECT_EQ(s.copies[0].src, before[4]);
  ASSERT_TRUE(d.m().Commit(1, 20).ok());
  d.Check();
  d.Add(2, Seq(21));
  EXPECT_EQ(d.Lookup(2).tokens, 20);  // the original block 4 is still there for others
}

TEST(Truncate, AcrossACheckpointRollsTheStateBack) {
  Driver d(Hybrid(8));
  d.Add(1, Seq(20));
  d.Prefill(1);
  for (int32_t t = 0; t < 5; ++t)
    d.Decode(1, 900 + t);  // 25 tokens; checkpoint at 24
  const TruncateResult r = d.m().Truncate(1, 18).value();
  d.Check();
  // States exist at 8, 16 (interval and prompt end) and 24: the newest at or before 18 is 16.
  EXPECT_EQ(r.tokens, 18);
  EXPECT_EQ(r.computed, 16);
  EXPECT_EQ(r.recompute, 2);
  EXPECT_EQ(d.m().stats().recomputed_tokens, 2);
  EXPECT_EQ(d.m().NumComputed(1).value(), 16);
  d.Run(1, 2);
  EXPECT_EQ(d.m().NumComputed(1).value(), 18);
  // Back to the live state: nothing to recompute.
  const TruncateResult same = d.m().Truncate(1, 18).value();
  EXPECT_EQ(same.computed, 18);
  EXPECT_EQ(same.recompute, 0);
  d.Check();
}

TEST(Truncate, ToZeroAndBeyondTheComputedTokens) {
  Driver d(Hybrid());
  d.Add(1, Seq(9));
  d.Prefill(1);
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{1, 2, 3}).ok());
  const TruncateResult keep = d.m().Truncate(1, 11).value();  // 12 known, 9 computed
  EXPECT_EQ(keep.tokens, 11);
  EXPECT_EQ(keep.computed, 9);
  EXPECT_EQ(keep.recompute, 0);
  const TruncateResult zero = d.m().Truncate(1, 0).value();
  EXPECT_EQ(zero.tokens, 0);
  EXPECT_EQ(zero.computed, 0);
  EXPECT_EQ(zero.recompute, 0);  // nothing is left to compute again
  d.Check();
  EXPECT_EQ(d.Table(1, 0).size(), 0u);
}

TEST(Speculative, RejectedDraftsRollBackExactly) {
  Driver d(Hybrid());
  d.Add(1, Seq(10));
  d.Prefill(1);
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{50}).ok());  // 11 known, 10 computed
  // Verify one known token plus three drafts: positions 10..13.
  ASSERT_TRUE(d.m().Allocate(1, 4).ok());
  const StateStep st = d.m().State(1, 1).value();
  ASSERT_EQ(st.snapshots.size(), 3u);  // after 11, 12 and 13 tokens
  EXPECT_EQ(st.snapshots[0].position, 11);
  EXPECT_EQ(st.snapshots[2].position, 13);
  // A state must exist where the step stops: 12 has a snapshot, and no position before the known
  // tokens can be a stopping point.
  ASSERT_TRUE(d.m().Commit(1, 12).ok());
  d.Check();
  EXPECT_EQ(d.m().NumComputed(1).value(), 12);
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{51}).ok());
  // Computing all drafts, then truncating, lands on the same state.
  ASSERT_TRUE(d.m().AppendTokens(1, std::vector<int32_t>{52}).ok());
  ASSERT_TRUE(d.m().Allocate(1, 3).ok());  // positions 12..14: 12 known, 13 and 14 drafts
  ASSERT_TRUE(d.m().Commit(1, 15).ok());
  const TruncateResult r = d.m().Truncate(1, 14).value();
  EXPECT_EQ(r.computed, 14);
  EXPECT_EQ(r.recompute, 0);
  d.Check();
  d.Free(1);
  EXPECT_EQ(d.m().Usage(1).num_free, 63);
}

TEST(Speculative, DraftsAreNotCountedAsRecomputation) {
  ManagerConfig c = Hybrid();
  c.enable_prefix_caching = false;  // no checkpoints: a rollback goes back to the zero state
  Driver d(c);
  d.Add(1, Seq(8));
  ASSERT_TRUE(d.m().Allocate(1, 12).ok());  // 8 known tokens and 4 drafts
  ASSERT_TRUE(d.m().Commit(1, 12).ok());
  ASSERT_TRUE(d.m().Allocate(1, 4).ok());
  ASSERT_TRUE(d.m().Commit(1, 16).ok());
  d.Check();
  // Back to 10 (2 drafts kept): no state exists at or before 10 any more, so everything is
  // computed again — the 8 known tokens; the drafts are simply dropped.
  const TruncateResult r = d.m().Truncate(1, 10).value();
  EXPECT_EQ(r.tokens, 8);
  EXPECT_EQ(r.computed, 0);
  EXPECT_EQ(r.recompute, 8);
  d.Check();
}

TEST(Speculative, TruncatingToNothingStartsFromTheZeroState) {
  Driver d(Hybrid());
  d.Add(1, Seq(1));
  ASSERT_TRUE(d.m().Allocate(1, 4).ok());
  ASSERT_TRUE(d.m().Commit(1, 4).ok());
  ASSERT_TRUE(d.m().Truncate(1, 0).ok());
  d.Check();
  ASSERT_TRUE(d.m().Allocate(1, 5).ok());  // everything is a draft now
  EXPECT_EQ(d.m().State(1, 1).value().snapshots.front().position, 1);
  ASSERT_TRUE(d.m().Commit(1, 2).ok());
  ASSERT_TRUE(d.m().Truncate(1, 0).ok());
  d.Check();
  EXPECT_EQ(d.m().NumComputed(1).value(), 0);
  ASSERT_TRUE(d.m().AppendTokens(1, Seq(3)).ok());
  d.Run(1, 3);
}

TEST(Speculative, CommitWithoutAStateThereIsRefused) {
  Driver d(Hybrid());
  d.Add(1, Seq(10));
  ASSERT_TRUE(d.m().Allocate(1, 10).ok());
  Status s = d.m().Commit(1, 6);  // inside the prompt: no state after 6 tokens was kept
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no recurrent state after 6"), std::string::npos) << s.message();
  d.Check();
  ASSERT_TRUE(d.m().Commit(1, 10).ok());
}

}  // namespace
}  // namespace hkv::testing
