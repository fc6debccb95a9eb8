// Prefix hits across every kind of group: what Lookup finds, and what the first Allocate shares.
#include <algorithm>

#include <gtest/gtest.h>

#include <hkv/manager/manager_probe.h>

#include "manager_test_util.h"

namespace hkv::testing {
namespace {

TEST(PrefixHit, HitWhileTheOwnerStillRuns) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(10));
  EXPECT_EQ(d.Prefill(1).tokens, 0);
  d.Add(2, Seq(10));
  const PrefixHit hit = d.Lookup(2);
  // The last prompt token is always computed, and hits are whole blocks: 8 of 10.
  EXPECT_EQ(hit.tokens, 8);
  d.Run(2, 2, hit);
  const auto a = d.Table(1, 0), b = d.Table(2, 0);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);  // the partial block is private
  EXPECT_EQ(d.m().stats().hit_tokens, 8);
}

TEST(PrefixHit, HitAfterTheOwnerIsFreed) {
  Driver d(MakeConfig({64}, {Full(4)}));
  d.Add(1, Seq(13));
  d.Prefill(1);
  const auto owner = d.Table(1, 0);
  d.Free(1);
  EXPECT_EQ(d.m().Usage(0).num_free, 63);
  EXPECT_EQ(d.m().Usage(0).num_cached, 3);
  d.Add(2, Concat(Seq(12), Seq(5, 900)));
  const PrefixHit hit = d.Prefill(2);
  EXPECT_EQ(hit.tokens, 12);
  const auto t = d.Table(2, 0);
  EXPECT_TRUE(std::equal(owner.begin(), owner.begin() + 3, t.begin()));
}

TEST(PrefixHit, NoCachingMeansNoHits) {
  ManagerConfig c = MakeConfig({64}, {Full(4)});
  c.enable_prefix_caching = false;
  Driver d(c);
  d.Add(1, Seq(13));
  d.Prefill(1);
  d.Free(1);
  d.Add(2, Seq(13));
  EXPECT_EQ(d.Lookup(2).tokens, 0);
  EXPECT_EQ(d.m().Usage(0).num_cached, 0);
}

TEST(PrefixHit, SaltAndAdapterIsolateRequests) {
  Driver d(MakeConfig({128}, {Full(4)}));
  const auto prompt = Seq(17);
  RequestSpec tenant_a;
  tenant_a.cache_salt = "tenant-a";
  d.Add(1, prompt, tenant_a);
  d.Prefill(1);
  d.Add(2, prompt);  // no salt
  EXPECT_EQ(d.Lookup(2).tokens, 0);
  RequestSpec tenant_b;
  tenant_b.cache_salt = "tenant-b";
  d.Add(3, prompt, tenant_b);
  EXPECT_EQ(d.Lookup(3).tokens, 0);
  d.Add(4, prompt, tenant_a);
  EXPECT_EQ(d.Lookup(4).tokens, 16);

  RequestSpec lora;
  lora.adapter_id = 7;
  d.Add(5, prompt, lora);
  EXPECT_EQ(d.Lookup(5).tokens, 0);
  d.Prefill(5);
  lora.adapter_id = 8;
  d.Add(6, prompt, lora);
  EXPECT_EQ(d.Lookup(6).tokens, 0);
  lora.adapter_id = 7;
  d.Add(7, prompt, lora);
  EXPECT_EQ(d.Lookup(7).tokens, 16);
}

TEST(PrefixHit, MultimodalItemsAreKeyedWithTheirOffsets) {
  Driver d(MakeConfig({128}, {Full(4)}));
  const auto prompt = Seq(17);
  const PromptItem image{{11, 22}, 5, 6};
  RequestSpec with_image;
  with_image.items = {&image, 1};
  d.Add(1, prompt, with_image);
  d.Prefill(1);
  d.Add(2, prompt, with_image);
  EXPECT_EQ(d.Lookup(2).tokens, 16);
  // The same image at another offset, or another image, shares only blocks before it.
  const PromptItem moved{{11, 22}, 6, 6};
  RequestSpec shifted;
  shifted.items = {&moved, 1};
  d.Add(3, prompt, shifted);
  EXPECT_EQ(d.Lookup(3).tokens, 4);
  const PromptItem other{{11, 23}, 5, 6};
  RequestSpec different;
  different.items = {&other, 1};
  d.Add(4, prompt, different);
  EXPECT_EQ(d.Lookup(4).tokens, 4);
}

TEST(PrefixHit, HitsAlignToTheLcmOfBlockSizes) {
  // Full attention in blocks of 4, a window group in blocks of 8: hits are multiples of 8.
  Driver d(MakeConfig({128, 128}, {Full(4, 0), Window(16, 8, 1)}));
  EXPECT_EQ(d.m().config().align_tokens(), 8);
  EXPECT_EQ(d.m().config().hash_tokens(), 4);
  d.Add(1, Seq(30));
  d.Prefill(1);
  d.Add(2, Seq(30));
  EXPECT_EQ(d.Lookup(2).tokens, 24);
}

TEST(PrefixHit, DropLastHitBlockForSpeculativeDecoding) {
  ManagerConfig c = MakeConfig({128}, {Full(4)});
  c.drop_last_hit_block = true;
  Driver d(c);
  d.Add(1, Seq(30));
  d.Prefill(1);
  d.Add(2, Seq(30));
  EXPECT_EQ(d.Lookup(2).tokens, 24);  // 28 without the drop
}

// Evicts exactly the blocks in front of `block` on `pool`'s free list, by running a request
// with unrelated tokens that needs that many blocks from every group.
void EvictUpTo(Driver& d, RequestId id, int32_t pool, int32_t block, int32_t bs) {
  const auto order = ManagerProbe::FreeListOrder(d.m(), pool);
  const auto at = std::find(order.begin(), order.end(), block) - order.begin();
  ASSERT_LT(at, static_cast<ptrdiff_t>(order.size()));
  d.Add(id, Seq(static_cast<int32_t>(at) * bs, 5000));
  Status s = d.m().Allocate(id, static_cast<int64_t>(at) * bs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  d.Check();
}

TEST(PrefixHit, WindowHeadMissKeepsTheHitButFullAttentionMissShortensIt) {
  // Pool 0 is the window group's alone, so its eviction can be steered block by block; pool 1
  // (full attention) is large enough to keep everything. vLLM's eviction order: the window
  // blocks released at commit keep their place at the front of the free list.
  ManagerConfig vllm_order = MakeConfig({16, 256}, {Window(8, 4, 0), Full(4, 1)});
  vllm_order.coherent_eviction = false;
  Driver d(vllm_order);
  d.Add(1, Seq(33));
  d.Prefill(1);
  const auto window = d.Table(1, 0);
  // The window released blocks 0..5 at commit; 6, 7 (the last window) and 8 are still held.
  for (int j = 0; j < 6; ++j)
    EXPECT_EQ(window[static_cast<size_t>(j)], 0) << j;
  d.Free(1);
  d.m().TakeEvents();
  // Evict everything on the window pool's free list before the last window's first block.
  const auto order = ManagerProbe::FreeListOrder(d.m(), 0);
  ASSERT_NO_FATAL_FAILURE(EvictUpTo(d, 50, 0, order[order.size() - 2], 4));
  const auto events = d.m().TakeEvents();
  const auto removed = std::count_if(events.begin(), events.end(), [](const ManagerEvent& e) {
    return e.kind == KvEvent::Kind::kRemoved && e.group == 0;
  });
  EXPECT_EQ(removed, 6);  // the head of the window group's chain is gone
  d.Add(2, Seq(33));
  EXPECT_EQ(d.Lookup(2).tokens, 32);

  // Now a full-attention block in the middle: the hit stops before it.
  Driver e(MakeConfig({256, 12}, {Window(8, 4, 0), Full(4, 1)}));
  e.Add(1, Seq(33));
  e.Prefill(1);
  const auto full = e.Table(1, 1);
  e.Free(1);
  // Free tail-first: the full group's blocks sit on the list as 7, 6, ..., 0 (block 8 was
  // partial, without identity, and went to the head). Evicting through block 5 leaves 0..4.
  ASSERT_NO_FATAL_FAILURE(EvictUpTo(e, 50, 1, full[4], 4));
  e.Add(2, Seq(33));
  EXPECT_EQ(e.Lookup(2).tokens, 20);
}

TEST(PrefixHit, ChunkedGroupsNeedOnlyTheCurrentChunk) {
  Driver d(MakeConfig({64, 64}, {Chunk(8, 4, 0), Full(4, 1)}));
  d.Add(1, Seq(21));
  d.Prefill(1);
  const auto chunk = d.Table(1, 0);
  EXPECT_EQ(chunk[0], 0);  // chunk [0, 8) and [8, 16) are released
  EXPECT_EQ(chunk[3], 0);
  EXPECT_NE(chunk[4], 0);
  d.Free(1);
  d.Add(2, Seq(21));
  // Blocks 0..3 are gone (released, then evicted or not: they are never consulted); continuing
  // at 20 needs only [16, 20), the current chunk's first block.
  EXPECT_EQ(d.Lookup(2).tokens, 20);
}

TEST(PrefixHit, RecurrentHitsLandOnlyOnCheckpoints) {
  ManagerConfig c = MakeConfig({256, 64}, {Full(4, 0), StateGroup(1)});
  c.checkpoint_interval = 8;
  c.max_state_splits = 4;  // the one prefill step may split its chunk four times
  Driver d(c);
  d.Add(1, Seq(30));
  d.Prefill(1);
  // The step snapshotted the state at 8, 16, 24 (interval) and 28 (last aligned position
  // before the prompt's end).
  d.Free(1);
  d.Add(2, Concat(Seq(26), Seq(10, 700)));
  EXPECT_EQ(d.Lookup(2).tokens, 24);
  d.Add(3, Concat(Seq(22), Seq(10, 700)));
  EXPECT_EQ(d.Lookup(3).tokens, 16);  // attention could give 20; the state exists only at 16
  d.Add(4, Seq(30));
  const PrefixHit hit = d.Lookup(4);
  EXPECT_EQ(hit.tokens, 28);
  ASSERT_TRUE(d.m().Allocate(4, 2, hit).ok());
  const StateStep st = d.m().State(4, 1).value();
  EXPECT_NE(st.read, 0);         // the checkpoint
  EXPECT_NE(st.write, st.read);  // never written in place: it is cached
  ASSERT_TRUE(d.m().Commit(4, 30).ok());
  d.Check();
}

TEST(PrefixHit, RecurrentStateIsPublishedWhereARequestEnds) {
  Driver d(MakeConfig({256, 64}, {Full(4, 0), StateGroup(1)}));
  d.Add(1, Seq(10));
  d.Prefill(1);
  for (int32_t t = 0; t < 7; ++t)
    d.Decode(1, 900 + t);  // reaches 17 tokens, rolling at 16
  d.Free(1);
  // A follow-up turn that extends the conversation hits at the rolling state (16).
  d.Add(2, Concat(Concat(Seq(10), Seq(7, 900)), Seq(5, 50)));
  EXPECT_EQ(d.Lookup(2).tokens, 16);
}

TEST(PrefixHit, TheRollingStateKeepsUpWithMultiTokenSteps) {
  Driver d(MakeConfig({256, 64}, {Full(4, 0), StateGroup(1)}));
  d.Add(1, Seq(10));
  d.Prefill(1);
  // A 13-token step ending off the grid (at 23): the state after 20 is copied aside in it.
  ASSERT_TRUE(d.m().AppendTokens(1, Seq(13, 900)).ok());
  ASSERT_TRUE(d.m().Allocate(1, 13).ok());
  const StateStep st = d.m().State(1, 1).value();
  ASSERT_EQ(st.snapshots.size(), 1u);
  EXPECT_EQ(st.snapshots[0].position, 20);
  ASSERT_TRUE(d.m().Commit(1, 23).ok());
  d.Check();
  d.Free(1);
  d.Add(2, Concat(Concat(Seq(10), Seq(13, 900)), Seq(4, 50)));
  EXPECT_EQ(d.Lookup(2).tokens, 20);
}

TEST(PrefixHit, CrossAttentionEncoderBlocksAreShared) {
  Driver d(MakeConfig({128, 64}, {Full(4, 0), Encoder(4, 1)}));
  RequestSpec image;
  image.encoder_tokens = 10;
  image.encoder_input = {1, 2};
  d.Add(1, Seq(9), image);
  ASSERT_TRUE(d.m().Allocate(1, 9).ok());
  EXPECT_TRUE(d.m().Step(1).value().run_encoder);
  ASSERT_TRUE(d.m().Commit(1, 9).ok());
  d.Check();
  const auto enc = d.Table(1, 1);
  EXPECT_EQ(enc.size(), 3u);
  d.Decode(1, 5);
  d.Add(2, Seq(5, 300), image);  // another question about the same image
  const PrefixHit hit = d.Lookup(2);
  EXPECT_TRUE(hit.encoder);
  EXPECT_EQ(hit.tokens, 0);
  ASSERT_TRUE(d.m().Allocate(2, 5, hit).ok());
  EXPECT_FALSE(d.m().Step(2).value().run_encoder);
  EXPECT_EQ(d.Table(2, 1), enc);
  ASSERT_TRUE(d.m().Commit(2, 5).ok());
  d.Check();
  RequestSpec other = image;
  other.encoder_input = {1, 3};
  d.Add(3, Seq(5, 300), other);
  EXPECT_FALSE(d.Lookup(3).encoder);
  EXPECT_EQ(d.m().stats().encoder_hits, 1);
}

// One pool shared by a window group (span 8 unless given) and full attention, both with 4-token
// blocks, sized so that after the 33-token request is freed the free list holds exactly its 18
// blocks. A filler request of `evict` / 2 * 4 tokens then takes (evicts) `evict` blocks from the
// front.
int64_t HitAfterEvicting(bool coherent, int32_t evict, int32_t span = 8) {
  ManagerConfig c = MakeConfig({19}, {Window(span, 4, 0), Full(4, 0)});
  c.coherent_eviction = coherent;
  Driver d(c);
  d.Add(1, Seq(33));
  d.Prefill(1);  // the window released its blocks 0..5 at commit
  d.Free(1);
  d.Add(50, Seq(evict / 2 * 4, 5000));
  EXPECT_TRUE(d.m().Allocate(50, evict / 2 * 4).ok());
  d.Check();
  d.Add(2, Seq(33));
  return d.Lookup(2).tokens;
}

TEST(PrefixHit, TheWholeHitOutlivesTheWindowBlocksReleasedMidway) {
  // The 33-token request is four spans of its 8-token window, too long to take them back: the
  // window released blocks 0..5 when they left it; they keep their places at the front of the
  // free list, behind the blocks without identity. Free then releases the rest tail first:
  // coherently [partials, w5..w0, w7, f7, w6, f6, f5, ..., f0], in vLLM's order
  // [partials, w5..w0, w7, w6, f7, ..., f0]. Either way the hit at the request's end - what its
  // next turn needs - outlives every block only a hit in the middle would use, and once its last
  // window goes nothing is left to hit.
  for (bool coherent : {true, false}) {
    EXPECT_EQ(HitAfterEvicting(coherent, 2), 32) << coherent;
    EXPECT_EQ(HitAfterEvicting(coherent, 6), 32) << coherent;
    EXPECT_EQ(HitAfterEvicting(coherent, 8), 32) << coherent;
    EXPECT_EQ(HitAfterEvicting(coherent, 10), 0) << coherent;
  }
}

TEST(PrefixHit, AShortRequestsReleasedWindowRejoinsTheOrderSoAnEvictedTailShortensTheHit) {
  // A 16-token window (four blocks) over the 33-token request, about two spans: at Free the
  // blocks it released (0..3) are still cached, rejoin the coherent order, and the list is
  // [partials, w7, f7, w6, f6, ..., w0, f0]: each evicted pair shortens the hit by one block and
  // the window before the shorter hit is still there.
  EXPECT_EQ(HitAfterEvicting(true, 2, 16), 32);
  EXPECT_EQ(HitAfterEvicting(true, 4, 16), 28);
  EXPECT_EQ(HitAfterEvicting(true, 6, 16), 24);
  EXPECT_EQ(HitAfterEvicting(true, 10, 16), 16);
  // vLLM's order leaves them first in line ([partials, w3..w0, w7..w4, f7..f0]): the whole hit
  // survives them, and once the last window goes nothing is left to hit.
  EXPECT_EQ(HitAfterEvicting(false, 6, 16), 32);
  EXPECT_EQ(HitAfterEvicting(false, 8, 16), 0);
}

TEST(PrefixHit, AWindowInAPoolOfItsOwnKeepsItsReleasedBlocksInPlace) {
  // The window alone in pool 0: coherent release has no full-attention block to interleave its
  // blocks with, so those it released keep their places at the front of the list.
  Driver d(MakeConfig({16, 64}, {Window(16, 4, 0), Full(4, 1)}));
  d.Add(1, Seq(33));
  d.Prefill(1);  // the window released its blocks 0..3
  const auto before = ManagerProbe::FreeListOrder(d.m(), 0);
  const auto released = d.Table(1, 0);
  d.Free(1);
  const auto after = ManagerProbe::FreeListOrder(d.m(), 0);
  ASSERT_GE(after.size(), before.size());
  // Every block that was free stays where it was, ahead of what Free released to the tail.
  const auto at = std::search(after.begin(), after.end(), before.begin(), before.end());
  EXPECT_NE(at, after.end());
  EXPECT_EQ(released[0], 0);  // block 0 had left the table
}

TEST(PrefixHit, DivergenceFromACachedPrefixLeavesACheckpointForTheNext) {
  // Full attention (4-token blocks) and one recurrent state group in its own pool.
  Driver d(MakeConfig({64, 16}, {Full(4, 0), StateGroup(1)}));
  const std::vector<int32_t> system = Seq(16, 100);
  d.Add(1, Concat(system, Seq(9, 1000)));
  d.Prefill(1);  // checkpoints at 24 (its prompt's last aligned position) and nowhere else
  d.Free(1);
  // Request 2 shares the 16 system tokens: attention is cached there, the state is not. It
  // computes from 0, and the state at 16, where it leaves the cached prefix, is kept.
  d.Add(2, Concat(system, Seq(9, 2000)));
  EXPECT_EQ(d.Prefill(2).tokens, 0);
  d.Free(2);
  // Request 3 shares the same system tokens and now hits them.
  d.Add(3, Concat(system, Seq(9, 3000)));
  EXPECT_EQ(d.Lookup(3).tokens, 16);
  d.Prefill(3);
  d.Free(3);
  d.Check();
}

}  // namespace
}  // namespace hkv::testing
