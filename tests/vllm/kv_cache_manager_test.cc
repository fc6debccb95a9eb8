// vllm::KvCacheManager on small hand-made configs: the rules in which vLLM differs from hkv's
// own manager (free-queue order, caching at allocation, duplicates, window release, Mamba align),
// bad input, and the invariant checker over random replays of every supported bundled model.
#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>

#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>
#include <hkv/spec/config_loader.h>
#include <hkv/vllm/kv_cache_manager.h>

namespace hkv::vllm {
namespace {

KvCacheSpec Attention(SpecType type, int32_t block_size) {
  KvCacheSpec s;
  s.type = type;
  s.block_size = block_size;
  s.num_kv_heads = 1;
  s.head_size = s.head_size_v = 2;
  s.dtype_bytes = 2;
  return s;
}

// One full-attention group of 4-token blocks, `blocks` usable.
KvCacheConfig FullConfig(int32_t blocks) {
  KvCacheConfig c;
  c.groups = {{Attention(SpecType::kFullAttention, 4), {0}}};
  c.num_blocks = blocks + 1;
  c.cache_block_size = c.hash_block_size = c.scheduler_block_size = 4;
  c.max_model_len = 64;
  c.max_num_batched_tokens = 64;
  return c;
}

std::vector<int32_t> Iota(int32_t n, int32_t first = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

Status Allocate(KvCacheManager& m, Request& r, int64_t n, bool admit = false,
                GroupBlocks* out = nullptr) {
  AllocateArgs a;
  a.num_new_tokens = n;
  ComputedBlocks hit;
  if (admit) {
    hit = m.GetComputedBlocks(r).value();
    a.num_new_computed_tokens = hit.num_tokens;
    a.new_computed = &hit;
    a.num_new_tokens = n - hit.num_tokens;
  }
  const Status st = m.AllocateSlots(r, a, out);
  if (st.ok() && admit) r.num_computed_tokens = hit.num_tokens;
  return st;
}

TEST(VllmManager, FreedBlocksJoinTheTailLastBlockFirst) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(6)).value();
  EXPECT_EQ(m.FreeQueue(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  Request r(7, Iota(10), 4);
  GroupBlocks got;
  ASSERT_TRUE(Allocate(m, r, 10, true, &got).ok());
  EXPECT_EQ(got.groups[0], (std::vector<int32_t>{1, 2, 3}));
  m.Free(7);
  // Every freed block goes to the tail (the partial one too), the request's last block first.
  EXPECT_EQ(m.FreeQueue(), (std::vector<int32_t>{4, 5, 6, 3, 2, 1}));
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, BlocksAreCachedWhenAllocatedSoTheSameStepHits) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(10)).value();
  Request a(1, Iota(12), 4);
  ASSERT_TRUE(Allocate(m, a, 12, true).ok());  // nothing computed yet
  Request b(2, Iota(12), 4);
  const ComputedBlocks hit = m.GetComputedBlocks(b).value();
  EXPECT_EQ(hit.num_tokens, 8);  // two whole blocks, capped below the last token
  EXPECT_EQ(hit.blocks.groups[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(m.Stats().num_cached, 3);
}

TEST(VllmManager, DuplicateIdentitiesStayCachedAndTheFirstServesHits) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(10)).value();
  Request a(1, Iota(6), 4);
  Request b(2, Iota(6), 4);
  // Both looked up before either allocated: both miss and compute the same first block.
  const ComputedBlocks ha = m.GetComputedBlocks(a).value(), hb = m.GetComputedBlocks(b).value();
  EXPECT_EQ(ha.num_tokens + hb.num_tokens, 0);
  AllocateArgs args;
  args.num_new_tokens = 6;
  ASSERT_TRUE(m.AllocateSlots(a, args).ok());
  ASSERT_TRUE(m.AllocateSlots(b, args).ok());
  EXPECT_EQ(m.Stats().num_cached, 2);  // block 1 (a) and block 3 (b) hold the same identity
  Request c(3, Iota(6), 4);
  EXPECT_EQ(m.GetComputedBlocks(c).value().blocks.groups[0], (std::vector<int32_t>{1}));
  m.Free(1);
  // The queue is now 5..10, 2, 1: taking all eight reuses block 1 and drops its identity;
  // block 3 then serves the hit.
  EXPECT_EQ(m.FreeQueue(), (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 2, 1}));
  Request filler(4, Iota(32, 100), 4);
  args.num_new_tokens = 32;
  ASSERT_TRUE(m.AllocateSlots(filler, args).ok());
  EXPECT_EQ(m.GetComputedBlocks(c).value().blocks.groups[0], (std::vector<int32_t>{3}));
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, SlidingWindowBlocksLeaveAsTheWindowMoves) {
  KvCacheConfig c = FullConfig(20);
  c.groups[0].spec = Attention(SpecType::kSlidingWindow, 4);
  c.groups[0].spec.sliding_window = 6;
  KvCacheManager m = KvCacheManager::Create(c).value();
  Request r(1, Iota(24), 4);
  ASSERT_TRUE(Allocate(m, r, 8, true).ok());
  r.num_computed_tokens = 8;
  ASSERT_TRUE(Allocate(m, r, 8).ok());
  r.num_computed_tokens = 16;
  // Computed 16: tokens before 16 - 6 + 1 = 11 are skipped, so blocks 0 and 1 (tokens 0..7)
  // were released before this allocation (block 2 holds token 11).
  ASSERT_TRUE(Allocate(m, r, 8).ok());
  const GroupBlocks ids = m.GetBlockIds(1);
  ASSERT_EQ(ids.groups[0].size(), 6u);
  EXPECT_EQ(ids.groups[0][0], 0);
  EXPECT_EQ(ids.groups[0][1], 0);
  EXPECT_NE(ids.groups[0][2], 0);
  EXPECT_EQ(m.Stats().num_free, 20 - 4);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// Groups of different block sizes (a window layer with half the page of a full one gets half
// the block): hits and caching align to the lcm (8). A window block a hit can never consult
// (only the tail of each 8-token segment, cdiv(window - 1, 4) = 1 block, is) stays out of the
// prefix map.
TEST(VllmManager, MixedBlockSizesCacheOnlyWhatAHitConsults) {
  KvCacheConfig c = FullConfig(40);
  c.groups = {{Attention(SpecType::kFullAttention, 8), {0}},
              {Attention(SpecType::kSlidingWindow, 4), {1}}};
  c.groups[1].spec.sliding_window = 5;
  c.hash_block_size = 4;
  c.scheduler_block_size = 8;
  KvCacheManager m = KvCacheManager::Create(c).value();
  Request a(1, Iota(20), 4);
  ASSERT_TRUE(Allocate(m, a, 20, true).ok());
  // Cached to 16 (20 rounded down to the lcm): full blocks 0, 1; window blocks 1 and 3 of 0..3.
  EXPECT_EQ(m.Stats().num_cached, 4);
  const GroupBlocks ids = m.GetBlockIds(1);
  ASSERT_EQ(ids.groups[1].size(), 5u);
  // A prompt sharing 18 tokens hits 16: the window's last block before 16 is cached, the full
  // group holds both blocks, and 16 is a multiple of 8.
  std::vector<int32_t> prompt = Iota(18);
  prompt.push_back(500);
  prompt.push_back(501);
  Request b(2, prompt, 4);
  const ComputedBlocks hit = m.GetComputedBlocks(b).value();
  EXPECT_EQ(hit.num_tokens, 16);
  ASSERT_EQ(hit.blocks.groups[1].size(), 4u);
  EXPECT_EQ(hit.blocks.groups[1][0], 0);  // skipped: outside the window
  EXPECT_EQ(hit.blocks.groups[1][3], ids.groups[1][3]);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// Full attention and a Mamba group in `mode`, 4-token blocks, `blocks` usable.
KvCacheConfig MambaConfig(int32_t blocks, MambaCacheMode mode) {
  KvCacheConfig c = FullConfig(blocks);
  KvCacheSpec mamba;
  mamba.type = SpecType::kMamba;
  mamba.block_size = 4;
  mamba.state_tensor_bytes = {16};
  mamba.mamba_cache_mode = mode;
  c.groups.push_back({mamba, {1}});
  c.has_mamba = true;
  c.mamba_cache_mode = mode;
  return c;
}

TEST(VllmManager, MambaAlignKeepsTheLastStateAndReleasesTheOneBefore) {
  KvCacheManager m = KvCacheManager::Create(MambaConfig(20, MambaCacheMode::kAlign)).value();
  Request r(1, Iota(16), 4);
  // First chunk of 8: one state block at the chunk's end, a null block before it.
  ASSERT_TRUE(Allocate(m, r, 8, true).ok());
  EXPECT_EQ(m.GetBlockIds(1).groups[1], (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(m.GetBlockIds(1).groups[0], (std::vector<int32_t>{1, 2}));
  r.num_computed_tokens = 8;
  // Second chunk: a new state block at 16; the one at 8 stays until the new one is computed.
  ASSERT_TRUE(Allocate(m, r, 8).ok());
  EXPECT_EQ(m.GetBlockIds(1).groups[1], (std::vector<int32_t>{0, 3, 0, 6}));
  r.num_computed_tokens = 16;
  r.AppendToken(99);
  // Decoding: the state at 8 is released (it stays cached, so a later prompt can hit it).
  ASSERT_TRUE(Allocate(m, r, 1).ok());
  const GroupBlocks ids = m.GetBlockIds(1);
  ASSERT_EQ(ids.groups[1].size(), 5u);
  EXPECT_EQ(ids.groups[1][1], 0);
  EXPECT_EQ(ids.groups[1][3], 6);
  const std::vector<int32_t> queue = m.FreeQueue();
  EXPECT_NE(std::find(queue.begin(), queue.end(), 3), queue.end());
  Request follower(2, Iota(12), 4);
  EXPECT_EQ(m.GetComputedBlocks(follower).value().num_tokens, 8);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// --- the hybridkv policy (EvictionPolicy::kHybridKV): vLLM's layout, hybridkv's eviction order.

TEST(VllmHybridkvPolicy, ABlockWithoutIdentityIsReusedBeforeACachedOne) {
  for (const EvictionPolicy policy : {EvictionPolicy::kVllm, EvictionPolicy::kHybridKV}) {
    KvCacheManager m = KvCacheManager::Create(FullConfig(3), {.policy = policy}).value();
    Request r0(1, Iota(8), 4);  // two full blocks: 1 and 2, both cached
    ASSERT_TRUE(Allocate(m, r0, 8, true).ok());
    m.Free(1);
    EXPECT_EQ(m.FreeQueue(), (std::vector<int32_t>{3, 2, 1}));
    Request r1(2, Iota(5, 100), 4);  // takes 3 (cached: 100..103) and 2 (partial, no identity)
    ASSERT_TRUE(Allocate(m, r1, 5, true).ok());
    m.Free(2);
    // vLLM appends both at the tail; the hybridkv policy puts the block without identity first.
    const std::vector<int32_t> vllm_order = {1, 2, 3}, hybridkv_order = {2, 1, 3};
    EXPECT_EQ(m.FreeQueue(), policy == EvictionPolicy::kVllm ? vllm_order : hybridkv_order);
    Request r2(3, Iota(4, 200), 4);  // one block: vLLM evicts r0's first block, hybridkv none
    ASSERT_TRUE(Allocate(m, r2, 4, true).ok());
    Request again(4, Iota(8), 4);
    EXPECT_EQ(m.GetComputedBlocks(again).value().num_tokens,
              policy == EvictionPolicy::kVllm ? 0 : 4);
    EXPECT_TRUE(m.CheckInvariants().ok());
  }
}

TEST(VllmHybridkvPolicy, StatesARequestMovedPastGoFirstUnlessAnotherRequestHitThem) {
  for (const EvictionPolicy policy : {EvictionPolicy::kVllm, EvictionPolicy::kHybridKV}) {
    KvCacheManager m =
        KvCacheManager::Create(MambaConfig(30, MambaCacheMode::kAll), {.policy = policy}).value();
    Request r(1, Iota(16), 4);
    ASSERT_TRUE(Allocate(m, r, 16, true).ok());
    const std::vector<int32_t> states = m.GetBlockIds(1).groups[1];  // at 4, 8, 12, 16
    ASSERT_EQ(states.size(), 4u);
    r.num_computed_tokens = 16;
    m.NewStepStarts();  // a state cached this step is not computed yet; the next step may hit it
    // Another request shares the first 8 tokens and hits the state at 8.
    std::vector<int32_t> other = Iota(8);
    for (int32_t t : Iota(4, 500))
      other.push_back(t);
    Request follower(2, other, 4);
    ASSERT_TRUE(Allocate(m, follower, 12, true).ok());
    ASSERT_EQ(follower.num_computed_tokens, 8);
    m.Free(2);
    // A decode step: r frees its states at 4, 8 and 12 and keeps the one at 16.
    r.AppendToken(99);
    ASSERT_TRUE(Allocate(m, r, 1).ok());
    const std::vector<int32_t> queue = m.FreeQueue();
    const int32_t fresh = m.GetBlockIds(1).groups[0].back();  // the step's new attention block
    if (policy == EvictionPolicy::kVllm) {
      // vLLM: all at the tail, the newest first; the new block came from the queue's front.
      EXPECT_EQ(std::vector<int32_t>(queue.end() - 3, queue.end()),
                (std::vector<int32_t>{states[2], states[1], states[0]}));
      EXPECT_EQ(std::find(states.begin(), states.end(), fresh), states.end());
    } else {
      // The state at 4 is superseded and is no branch point (the prefix is shared past it): it
      // went to the front, so the step's new block evicted it. The one at 8 was hit (a branch
      // point) and the one at 12 is the newest r moved past: both keep their place at the tail.
      EXPECT_EQ(fresh, states[0]);
      EXPECT_EQ(std::vector<int32_t>(queue.end() - 2, queue.end()),
                (std::vector<int32_t>{states[2], states[1]}));
      // The state at 12 is the one a follow-up turn hits.
      Request turn(3, Iota(14), 4);
      EXPECT_EQ(m.GetComputedBlocks(turn).value().num_tokens, 12);
    }
    EXPECT_TRUE(m.CheckInvariants().ok());
  }
}

TEST(VllmManager, AFailedAllocationOrBadArgumentChangesNothing) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(3)).value();
  Request a(1, Iota(8), 4);
  ASSERT_TRUE(Allocate(m, a, 8, true).ok());
  const std::vector<int32_t> queue = m.FreeQueue();
  Request big(2, Iota(12, 50), 4);
  AllocateArgs args;
  args.num_new_tokens = 12;
  const Status short_of_blocks = m.AllocateSlots(big, args);
  EXPECT_EQ(short_of_blocks.code(), StatusCode::kResourceExhausted);
  args.num_new_tokens = 0;
  const Status zero = m.AllocateSlots(big, args);
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("0 new tokens"), std::string::npos);
  // Slots past the request's 12 tokens are granted, as vLLM grants them for draft tokens; only
  // the count check above refuses (13 needs 4 blocks, 3 are free).
  args.num_new_tokens = 13;
  EXPECT_EQ(m.AllocateSlots(big, args).code(), StatusCode::kResourceExhausted);
  args.num_new_tokens = 4;
  args.num_new_computed_tokens = -1;
  const Status computed = m.AllocateSlots(big, args);
  EXPECT_EQ(computed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(computed.message().find("-1 new computed tokens; expected at least 0"),
            std::string::npos)
      << computed.message();
  args.num_new_computed_tokens = 0;
  args.num_lookahead_tokens = -2;
  const Status lookahead = m.AllocateSlots(big, args);
  EXPECT_EQ(lookahead.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lookahead.message().find("-2 lookahead tokens; expected at least 0"), std::string::npos)
      << lookahead.message();
  args.num_lookahead_tokens = 0;
  Request other_hash(3, Iota(8), 8);
  args.num_new_tokens = 4;
  EXPECT_EQ(m.AllocateSlots(other_hash, args).code(), StatusCode::kInvalidArgument);
  const Result<ComputedBlocks> wrong_lookup = m.GetComputedBlocks(other_hash);
  ASSERT_FALSE(wrong_lookup.ok());
  EXPECT_NE(wrong_lookup.status().message().find("hash block size 8 is not the manager's 4"),
            std::string::npos)
      << wrong_lookup.status().message();
  Request no_hash(4, Iota(8), 0);  // hashes nothing (no division by zero), and is refused
  no_hash.AppendToken(9);
  EXPECT_TRUE(no_hash.block_hashes().empty());
  EXPECT_EQ(m.GetComputedBlocks(no_hash).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.AllocateSlots(no_hash, args).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.FreeQueue(), queue);
  EXPECT_TRUE(m.GetBlockIds(2).empty());
  EXPECT_FALSE(m.ResetPrefixCache());  // a is still held
  m.Free(1);
  m.Free(1);  // vLLM's free of a request that holds nothing is a no-op
  EXPECT_TRUE(m.ResetPrefixCache());
  EXPECT_EQ(m.Stats().num_cached, 0);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, EventsFollowVllmsBlockPool) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(4), {.record_events = true}).value();
  Request a(1, Iota(10), 4);
  ASSERT_TRUE(Allocate(m, a, 10, true).ok());
  std::vector<CacheEvent> e = m.TakeEvents();
  ASSERT_EQ(e.size(), 1U);  // one BlockStored per caching call and group
  EXPECT_EQ(e[0].kind, CacheEvent::Kind::kStored);
  EXPECT_EQ(e[0].request, 1);
  EXPECT_EQ(e[0].first_block, 0);
  EXPECT_EQ(e[0].end_block, 2);
  EXPECT_EQ(e[0].blocks, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(e[0].indices, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(m.TakeEvents().empty());
  m.Free(1);
  // Popping a cached block from the free queue drops its identity: one BlockRemoved each.
  Request b(2, Iota(16, 50), 4);
  AllocateArgs args;
  args.num_new_tokens = 15;
  ASSERT_TRUE(m.AllocateSlots(b, args).ok());
  e = m.TakeEvents();
  ASSERT_GE(e.size(), 3U);
  EXPECT_EQ(e[0].kind, CacheEvent::Kind::kRemoved);
  EXPECT_EQ(e[1].kind, CacheEvent::Kind::kRemoved);
  EXPECT_EQ(e.back().kind, CacheEvent::Kind::kStored);
  m.Free(2);
  ASSERT_TRUE(m.ResetPrefixCache());
  e = m.TakeEvents();
  ASSERT_EQ(e.size(), 1U);
  EXPECT_EQ(e[0].kind, CacheEvent::Kind::kAllCleared);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, ConnectorTokensGetBlocksAndDelayedBlocksAreCachedLater) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(8)).value();
  Request r(1, Iota(12), 4);
  AllocateArgs args;
  args.num_new_tokens = 4;
  args.num_external_computed_tokens = 8;
  args.delay_cache_blocks = true;
  GroupBlocks fresh;
  ASSERT_TRUE(m.AllocateSlots(r, args, &fresh).ok());
  EXPECT_EQ(fresh.groups[0], (std::vector<int32_t>{3}));  // the connector's blocks are not "new"
  EXPECT_EQ(m.GetBlockIds(1).groups[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(m.TakeNewBlockIds(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(m.Stats().num_cached, 0);
  Request probe(2, Iota(13), 4);
  EXPECT_EQ(m.GetComputedBlocks(probe).value().num_tokens, 0);
  r.num_computed_tokens = 12;
  ASSERT_TRUE(m.CacheBlocks(r, 12).ok());
  EXPECT_EQ(m.GetComputedBlocks(probe).value().num_tokens, 12);
  // Counts that do not add up are refused before anything moves.
  args.num_new_tokens = 0;
  args.num_external_computed_tokens = 0;
  EXPECT_EQ(m.AllocateSlots(r, args).code(), StatusCode::kInvalidArgument);
  args.num_external_computed_tokens = -4;
  EXPECT_EQ(m.AllocateSlots(r, args).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.CacheBlocks(r, 13).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, EngineHashedRequestsHitLikeTokenHashedOnes) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(8)).value();
  Request a(1, Iota(12), 4);
  ASSERT_TRUE(Allocate(m, a, 12, true).ok());
  // The same prefix described by the engine's own hashes: equal hashes, equal hits.
  Request b = Request::Hashed(2, 12, 4);
  b.Extend(12, std::span<const BlockHash>(a.block_hashes()).first(2));
  EXPECT_EQ(m.GetComputedBlocks(b).value().num_tokens, 8);
  // Caching past the hashes the engine gave is refused by name, and changes nothing.
  AllocateArgs args;
  args.num_new_tokens = 12;
  const Status st = m.AllocateSlots(b, args);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs 3 block hashes, it has 2"), std::string::npos) << st.message();
  EXPECT_TRUE(m.GetBlockIds(2).empty());
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, EvictBlocksDropsIdentitiesOnlyAndRefusesUnknownIds) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(8), {.record_events = true}).value();
  Request a(1, Iota(12), 4);
  ASSERT_TRUE(Allocate(m, a, 12, true).ok());
  m.TakeEvents();
  const int32_t bad[] = {1, 9};
  const Status st = m.EvictBlocks(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("evict block 9"), std::string::npos);
  EXPECT_TRUE(m.IsCached(1));
  const int32_t good[] = {0, 1, 5};  // the null block and an uncached one: no-ops
  ASSERT_TRUE(m.EvictBlocks(good).ok());
  EXPECT_FALSE(m.IsCached(1));
  EXPECT_TRUE(m.IsCached(2));
  EXPECT_EQ(m.TakeEvents().size(), 1U);
  EXPECT_EQ(m.GetBlockIds(1).groups[0].size(), 3U);  // still held
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(VllmManager, WithoutPrefixCachingNothingHitsOrIsShared) {
  KvCacheManager m = KvCacheManager::Create(FullConfig(8), {.enable_caching = false}).value();
  Request a(1, Iota(12), 4);
  ASSERT_TRUE(Allocate(m, a, 12, true).ok());
  Request b(2, Iota(12), 4);
  EXPECT_EQ(m.GetComputedBlocks(b).value().num_tokens, 0);
  EXPECT_EQ(m.Stats().num_cached, 0);
  EXPECT_EQ(m.NumCommonPrefixBlocks(1), (std::vector<int32_t>{0}));
  m.Free(1);
  EXPECT_TRUE(m.Idle());
}

TEST(VllmManager, TheReplayRefusesAConfigMadeForOtherLimits) {
  const Trace trace{TraceRequest{0, 0, {1, 2, 3}, 1, {4}}};
  ReplayOptions o;
  o.max_model_len = 64;
  o.token_budget = 32;  // the config was made for 64
  const Result<ReplayReport> r = ReplayVllm(trace, FullConfig(8), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("64 batched tokens, the replay's token budget is 32"),
            std::string::npos)
      << r.status().message();
  o.token_budget = 64;
  o.max_model_len = 128;
  const Result<ReplayReport> longer = ReplayVllm(trace, FullConfig(8), o);
  ASSERT_FALSE(longer.ok());
  EXPECT_EQ(longer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(longer.status().message().find("max model len 64, the replay uses 128"),
            std::string::npos)
      << longer.status().message();
}

TEST(VllmManager, CreateRefusesAConfigItCannotServe) {
  const auto refused = [](const KvCacheConfig& c, const std::string& what) {
    const Status s = KvCacheManager::Create(c).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  KvCacheConfig c = FullConfig(4);
  c.hash_block_size = 3;
  refused(c, "group block size 4 is not a multiple of the hash block size 3");
  c = FullConfig(4);
  c.groups[0].spec.block_size = 0;
  refused(c, "group block size 0; at least 1");
  c = FullConfig(4);
  c.num_blocks = 1;
  EXPECT_EQ(KvCacheManager::Create(c).status().code(), StatusCode::kInvalidArgument);
}

// Every supported bundled model, short of memory, over three seeds, with vLLM's eviction order
// and the hybridkv policy's: the checker after every step (ref counts = holders, the free queue =
// the unheld blocks, the prefix map names only blocks of that identity) and nothing held at the
// end.
TEST(VllmManager, RandomReplaysKeepTheInvariants) {
  const char* models[] = {"meta-llama--Llama-3.1-8B",
                          "google--gemma-2-9b",
                          "google--gemma-3-4b-it",
                          "openai--gpt-oss-20b",
                          "ibm-ai-platform--Bamba-9B",
                          "Qwen--Qwen3-Next-80B-A3B-Instruct",
                          "ai21labs--Jamba-v0.1",
                          "deepseek-ai--DeepSeek-V2-Lite",
                          "mistralai--Ministral-8B-Instruct-2410"};
  for (const char* name : models) {
    const ModelSpec model = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name).value();
    for (const MambaCacheMode mode : {MambaCacheMode::kAll, MambaCacheMode::kAlign}) {
      KvCacheOptions o;
      o.max_model_len = 3584;  // some prompt + output runs into it
      o.max_num_batched_tokens = 1024;
      o.mamba_cache_mode = mode;
      // Half as much again as the smallest memory vLLM accepts for one max-length request (at
      // the minimum itself vLLM may never admit one: its check forgets the null block).
      o.memory_bytes = int64_t{1} << 27;
      Result<KvCacheConfig> c = MakeKvCacheConfig(model, o);
      while (!c.ok() && c.status().code() == StatusCode::kResourceExhausted) {
        o.memory_bytes += o.memory_bytes / 4;
        c = MakeKvCacheConfig(model, o);
      }
      if (!c.ok() && c.status().code() == StatusCode::kUnsupported) continue;  // GDN in `all`
      ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
      o.memory_bytes += o.memory_bytes / 2;
      c = MakeKvCacheConfig(model, o);
      for (const uint64_t seed : {1u, 2u, 3u}) {
        TraceGenOptions g;
        g.num_requests = 40;
        g.seed = seed;
        g.session_gap = 20;
        g.max_prompt_tokens = 3000;
        Trace trace = GenerateTrace(g).value();
        ReplayOptions ro;
        ro.max_model_len = o.max_model_len;
        ro.token_budget = o.max_num_batched_tokens;
        ro.check_invariants = true;
        ro.record_requests = true;
        // The policies alternate over the seeds, so each model runs both in either cache mode.
        ro.vllm_policy = seed % 2 == 0 ? EvictionPolicy::kHybridKV : EvictionPolicy::kVllm;
        const Result<ReplayReport> r = ReplayVllm(trace, *c, ro);
        ASSERT_TRUE(r.ok()) << name << " seed " << seed << ": " << r.status().message();
        for (const RequestRecord& q : r->requests)
          EXPECT_GE(q.finish_step, 0) << name;
      }
    }
  }
}

}  // namespace
}  // namespace hkv::vllm
