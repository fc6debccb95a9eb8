// Window blocks at a branch point: a request whose prefix branches from another's keeps the
// window (or chunk) blocks a hit at the branch needs until it ends, instead of releasing them
// when they leave its window. Otherwise, while it runs, its full-attention blocks keep the shared
// prefix cached but eviction takes the window blocks, and no later request can hit the prefix
// (Gemma-2-9B's system prompts in `hkv simulate`). Kept windows are given back, one request's at
// a time, before an allocation is refused for lack of blocks.
#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

// Full attention and a window of 8 tokens in one pool, 4-token blocks: a 24-token prompt
// releases its first 4 window blocks at commit (continuing at 24 needs [17, 24)).
ManagerConfig WindowModel(bool coherent = true) {
  ManagerConfig c = MakeConfig({65}, {Full(4), Window(8, 4)});
  c.coherent_eviction = coherent;
  return c;
}

const std::vector<int32_t> kShared = Seq(8, 100);  // two blocks every prompt starts with

std::vector<int32_t> Prompt(int32_t suffix_base) {
  return Concat(kShared, Seq(16, suffix_base));
}

// A request with unrelated tokens takes every free block but at most one (each 4 tokens need a
// full-attention and a window block); its step stays open, so its window holds them all.
void TakeAllFree(Driver& d, RequestId id) {
  const int32_t free = d.m().Usage(0).num_free;
  d.Add(id, Seq(free / 2 * 4, 5000));
  Status s = d.m().Allocate(id, free / 2 * 4);
  ASSERT_TRUE(s.ok()) << s.ToString();
  d.Check();
  ASSERT_EQ(d.m().Usage(0).num_free, free % 2);
}

// Evicts every free block that still caches something: TakeAllFree, then the request ends. Its
// blocks carry no identity, so they are worth nothing afterwards.
void EvictAllFree(Driver& d, RequestId id) {
  ASSERT_NO_FATAL_FAILURE(TakeAllFree(d, id));
  d.Free(id);
}

// The window blocks of the shared prefix in `id`'s table (group 1), 0 where released.
std::vector<int32_t> SharedWindow(Driver& d, RequestId id) {
  const auto t = d.Table(id, 1);
  return {t.begin(), t.begin() + 2};
}

TEST(WindowBranch, KeptWhereTheFullAttentionPrefixOutlivedItsWindow) {
  Driver d(WindowModel());
  d.Add(1, Prompt(1000));
  EXPECT_EQ(d.Prefill(1).tokens, 0);
  EXPECT_EQ(SharedWindow(d, 1), (std::vector<int32_t>{0, 0}));  // left the window: released
  // Request 1 runs on and holds its full-attention blocks; its released window blocks go.
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
  d.Add(2, Prompt(2000));
  // The full-attention prefix reaches 8 but the window there is gone: no hit, and 8 is where
  // request 2 branches from request 1. It keeps the window blocks a hit at 8 needs.
  EXPECT_EQ(d.Prefill(2).tokens, 0);
  const auto kept = SharedWindow(d, 2);
  EXPECT_NE(kept[0], 0);
  EXPECT_NE(kept[1], 0);
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 91));
  // So a third request sharing the prefix hits it while both run.
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Lookup(3).tokens, 8);
  EXPECT_EQ(d.Prefill(3).tokens, 8);
  // Request 2 releases them with the rest of its blocks when it ends.
  d.Free(2);
  d.Free(3);
  d.Free(1);
  EXPECT_EQ(d.m().Usage(0).num_free, d.m().Usage(0).num_blocks);
}

TEST(WindowBranch, KeptWhereAnotherRunningRequestHoldsTheHit) {
  Driver d(WindowModel());
  d.Add(1, Prompt(1000));
  d.Prefill(1);
  // Request 2 hits the shared prefix (request 1 holds its full-attention blocks, its window
  // blocks are free but cached): 8 is a branch point of two running requests.
  d.Add(2, Prompt(2000));
  EXPECT_EQ(d.Prefill(2).tokens, 8);
  const auto kept = SharedWindow(d, 2);
  EXPECT_NE(kept[0], 0);
  EXPECT_NE(kept[1], 0);
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Prefill(3).tokens, 8);
  d.Free(1);
  d.Free(2);
  d.Free(3);
}

TEST(WindowBranch, NotKeptForATurnThatExtendsAFinishedOne) {
  // The next turn of a conversation hits the end of the previous one, which nobody runs any
  // more: an extension, not a branch, so its window is released as usual.
  Driver d(WindowModel());
  d.Add(1, Prompt(1000));
  d.Prefill(1);
  d.Free(1);
  d.Add(2, Concat(Prompt(1000), Seq(16, 7000)));
  EXPECT_EQ(d.Prefill(2).tokens, 24);
  EXPECT_EQ(SharedWindow(d, 2), (std::vector<int32_t>{0, 0}));
  const auto window = d.Table(2, 1);
  for (size_t j = 0; j < 8; ++j)
    EXPECT_EQ(window[j], 0) << j;  // continuing at 40 needs [33, 40): blocks 8 and 9
  d.Free(2);
}

// Request 2 keeps the shared window for a hit at 8 while request 1 runs; then request 90 takes
// every free block but at most one.
void KeepThenFill(Driver& d) {
  d.Add(1, Prompt(1000));
  d.Prefill(1);
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
  d.Add(2, Prompt(2000));
  d.Prefill(2);
  ASSERT_NE(SharedWindow(d, 2)[0], 0);
  ASSERT_NE(SharedWindow(d, 2)[1], 0);
  ASSERT_NO_FATAL_FAILURE(TakeAllFree(d, 90));
}

TEST(WindowBranch, GivenBackBeforeAnAllocationIsRefused) {
  // Kept windows are cache, not need: an allocation the free blocks cannot cover takes them
  // rather than fail (and push the engine to preempt someone).
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(KeepThenFill(d));
  d.Add(4, Seq(4, 8000));  // one full-attention and one window block
  const Status s = d.m().Allocate(4, 4);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(SharedWindow(d, 2), (std::vector<int32_t>{0, 0}));
  d.Check();
  ASSERT_TRUE(d.m().Commit(4, 4).ok());
  // Given back, not dropped: they stayed cached until request 4 took one of them.
  d.Free(4);
  d.Free(90);
  d.Free(2);
  d.Free(1);
  d.Check();
}

// The same with the admission looked up first, as an engine does: the blocks it needs besides its
// hit exceed the free ones, yet the kept windows make up the difference, so it is not refused
// from arithmetic (WaitingHead) but admitted.
TEST(WindowBranch, GivenBackBeforeALookedUpAdmissionIsRefused) {
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(KeepThenFill(d));
  d.Add(4, Seq(4, 8000));
  ASSERT_LT(d.m().Usage(0).num_free, 2);
  const Status s = d.m().Allocate(4, 4, d.Lookup(4));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(SharedWindow(d, 2), (std::vector<int32_t>{0, 0}));
  d.Check();
}

TEST(WindowBranch, ARefusalDespiteThemChangesNothing) {
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(KeepThenFill(d));
  const auto kept = SharedWindow(d, 2);
  const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  const int32_t free = d.m().Usage(0).num_free;
  d.Add(4, Seq(16, 8000));  // 8 blocks: more than the free and the kept ones together
  const Status s = d.m().Allocate(4, 16);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(SharedWindow(d, 2), kept);
  EXPECT_EQ(ManagerProbe::FreeListOrder(d.m(), 0), order);
  EXPECT_EQ(d.m().Usage(0).num_free, free);
  d.Check();
  // Still kept: a request sharing the prefix hits it.
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Lookup(3).tokens, 8);
  // Once request 90 ends there is room, and request 2 still keeps its window.
  d.Free(90);
  ASSERT_TRUE(d.m().Allocate(4, 16).ok());
  EXPECT_EQ(SharedWindow(d, 2), kept);
  ASSERT_TRUE(d.m().Commit(4, 16).ok());
  d.Free(4);
  d.Free(3);
  d.Free(2);
  d.Free(1);
  d.Check();
}

// Requests 1 and 2 share the prefix while both run (a branch at 8, which the manager remembers);
// then both end, the prefix still cached.
void BranchAndEnd(Driver& d) {
  d.Add(1, Prompt(1000));
  d.Prefill(1);
  d.Add(2, Prompt(2000));
  ASSERT_EQ(d.Prefill(2).tokens, 8);
  d.Free(1);
  d.Free(2);
}

// BranchAndEnd, then every cached block is evicted, the prefix included.
void BranchThenForget(Driver& d) {
  ASSERT_NO_FATAL_FAILURE(BranchAndEnd(d));
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
}

TEST(WindowBranch, ARememberedBranchIsKeptAfterItsPrefixWasEvicted) {
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(BranchThenForget(d));
  // Request 3 computes the prefix again: the cache shows no branch (nothing of it is cached), but
  // the memory does, so request 3 keeps the window a hit at 8 needs.
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Prefill(3).tokens, 0);
  const auto kept = SharedWindow(d, 3);
  EXPECT_NE(kept[0], 0);
  EXPECT_NE(kept[1], 0);
  EXPECT_EQ(d.m().stats().remembered_branches_kept, 1);
  // Its released window blocks are evicted while it runs; a request sharing the prefix still
  // hits it.
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 91));
  d.Add(4, Prompt(4000));
  EXPECT_EQ(d.Prefill(4).tokens, 8);
  d.Free(3);
  d.Free(4);
  d.Check();
  EXPECT_EQ(d.m().Usage(0).num_free, d.m().Usage(0).num_blocks);
}

TEST(WindowBranch, AFollowUpHoldsTheRememberedBranchInsideItsHit) {
  // Request 3 continues request 1's conversation: its hit (24) passes the shared prefix's
  // branch point (8), whose window blocks its hit does not take. It holds them while it runs,
  // so they stay cached with the prefix's full-attention blocks it holds anyway.
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(BranchAndEnd(d));
  d.Add(3, Concat(Prompt(1000), Seq(16, 7000)));
  EXPECT_EQ(d.Prefill(3).tokens, 24);
  const auto held = SharedWindow(d, 3);
  EXPECT_NE(held[0], 0);
  EXPECT_NE(held[1], 0);
  EXPECT_EQ(d.m().stats().remembered_branches_kept, 1);
  d.Check();
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
  d.Add(4, Prompt(4000));
  EXPECT_EQ(d.Prefill(4).tokens, 8);
  d.Free(3);
  d.Free(4);
  d.Check();
  EXPECT_EQ(d.m().Usage(0).num_free, d.m().Usage(0).num_blocks);
}

TEST(WindowBranch, AFollowUpLeavesABranchWindowAnotherRequestHolds) {
  // Request 5 keeps the shared prefix's window (a remembered branch at its hit); a follow-up
  // passing the branch then holds nothing more: the blocks are alive while request 5 runs, and
  // a second holder would only tie them to another request's step.
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(BranchAndEnd(d));
  d.Add(5, Prompt(5000));
  ASSERT_EQ(d.Prefill(5).tokens, 8);
  const auto kept = SharedWindow(d, 5);
  ASSERT_NE(kept[0], 0);
  ASSERT_NE(kept[1], 0);
  d.Add(3, Concat(Prompt(1000), Seq(16, 7000)));
  EXPECT_EQ(d.Prefill(3).tokens, 24);
  EXPECT_EQ(SharedWindow(d, 3), (std::vector<int32_t>{0, 0}));
  d.Check();
  d.Free(5);
  d.Free(3);
  d.Check();
}

TEST(WindowBranch, AResetPrefixCacheForgetsTheRememberedBranches) {
  Driver d(WindowModel());
  ASSERT_NO_FATAL_FAILURE(BranchAndEnd(d));
  ASSERT_TRUE(d.m().ResetPrefixCache().ok());
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Prefill(3).tokens, 0);
  EXPECT_EQ(SharedWindow(d, 3), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(d.m().stats().remembered_branches_kept, 0);
  d.Free(3);
  d.Check();
}

TEST(WindowBranch, WithoutTheMemoryAnEvictedBranchIsForgotten) {
  ManagerConfig c = WindowModel();
  c.branch_memory_entries = 0;
  Driver d(c);
  ASSERT_NO_FATAL_FAILURE(BranchThenForget(d));
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Prefill(3).tokens, 0);
  EXPECT_EQ(SharedWindow(d, 3), (std::vector<int32_t>{0, 0}));
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 91));
  d.Add(4, Prompt(4000));
  EXPECT_EQ(d.Prefill(4).tokens, 0);
  EXPECT_EQ(d.m().stats().remembered_branches_kept, 0);
  d.Free(3);
  d.Free(4);
}

// Requests 1 and 2 share the prefix while both run and end; request 3 then hits the whole prefix
// from the cache with nobody holding it: a branch only the memory knows. Whether request 3 keeps
// the window there.
bool KeepsARememberedBranchItHit(const ManagerConfig& c) {
  Driver d(c);
  BranchAndEnd(d);
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Prefill(3).tokens, 8);
  const bool kept = d.Table(3, 1)[0] != 0;
  EXPECT_EQ(d.m().stats().remembered_branches_kept, kept ? 1 : 0);
  d.Free(3);
  d.Check();
  return kept;
}

TEST(WindowBranch, TheMemoryIsOffWithTwoLevelMemory) {
  EXPECT_TRUE(KeepsARememberedBranchItHit(WindowModel()));
  // A window class of its own draws whole slabs; the pages a kept window pins cannot serve the
  // full-attention class, so there the memory is off and only the cache shows branches.
  ManagerConfig c = MakeConfig({33, 33}, {Full(4, 0), Window(8, 4, 1)});
  c.arena.num_slabs = 8;
  c.arena.pages_per_slab = {4, 4};
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  EXPECT_FALSE(KeepsARememberedBranchItHit(c));
}

TEST(WindowBranch, VllmOrderKeepsNothing) {
  // Without coherent eviction (vLLM's order, the padded allocator) windows are released as
  // they leave, and the shared prefix is lost while request 1 still holds its full attention.
  Driver d(WindowModel(/*coherent=*/false));
  d.Add(1, Prompt(1000));
  d.Prefill(1);
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 90));
  d.Add(2, Prompt(2000));
  EXPECT_EQ(d.Prefill(2).tokens, 0);
  EXPECT_EQ(SharedWindow(d, 2), (std::vector<int32_t>{0, 0}));
  ASSERT_NO_FATAL_FAILURE(EvictAllFree(d, 91));
  d.Add(3, Prompt(3000));
  EXPECT_EQ(d.Lookup(3).tokens, 0);
  d.Free(1);
  d.Free(2);
  d.Free(3);
}

}  // namespace
}  // namespace hkv::testing
