// BlockPool: allocation, sharing, lazy eviction, publication, events and the invariant checker.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

namespace hkv {
namespace {

PrefixKey Key(uint64_t n, int32_t group = 0) {
  return {{n, n * 31 + 7}, group};
}

BlockPool MakePool(int32_t n) {
  Result<BlockPool> p = BlockPool::Create(n);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

void ExpectValid(const BlockPool& p) {
  const Status s = p.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(BlockPoolTest, RejectsPoolsWithoutARealBlock) {
  EXPECT_EQ(BlockPool::Create(1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(BlockPool::Create(0).status().message().find("null block"), std::string::npos);
}

TEST(BlockPoolTest, AllocationIsAllOrNothingAndNeverHandsOutTheNullBlock) {
  BlockPool p = MakePool(5);
  EXPECT_EQ(p.num_free(), 4);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3}));
  const std::vector<int32_t> order_before = p.FreeListOrder();
  const Status s = p.Allocate(2, got);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("only 1 free"), std::string::npos);
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(p.FreeListOrder(), order_before);
  EXPECT_EQ(p.Allocate(-1, got).code(), StatusCode::kInvalidArgument);
  ExpectValid(p);
}

TEST(BlockPoolTest, FreedBlocksAreEvictedInTheOrderGivenAfterOlderOnes) {
  BlockPool p = MakePool(7);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(p.Allocate(3, a).ok());  // 1 2 3
  ASSERT_TRUE(p.Allocate(3, b).ok());  // 4 5 6
  // Request b ends first, tail block first; then request a.
  const std::vector<int32_t> b_tail_first = {6, 5, 4};
  const std::vector<int32_t> a_tail_first = {3, 2, 1};
  ASSERT_TRUE(p.Free(b_tail_first).ok());
  ASSERT_TRUE(p.Free(a_tail_first).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{6, 5, 4, 3, 2, 1}));
  ExpectValid(p);
}

TEST(BlockPoolTest, LowRetentionBlocksAreEvictedFirstInTheOrderGiven) {
  BlockPool p = MakePool(7);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(p.Allocate(3, a).ok());  // 1 2 3
  ASSERT_TRUE(p.Allocate(3, b).ok());  // 4 5 6
  const std::vector<int32_t> a_tail_first = {3, 2, 1};
  const std::vector<int32_t> b_tail_first = {6, 5, 4};
  ASSERT_TRUE(p.Free(a_tail_first).ok());
  ASSERT_TRUE(p.Free(b_tail_first, Retention::kLow).ok());
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{6, 5, 4, 3, 2, 1}));
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(1, got).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{6}));
  ExpectValid(p);
}

TEST(BlockPoolTest, LazyEvictionKeepsIdentityUntilReuse) {
  BlockPool p = MakePool(3);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(1, got).ok());
  ASSERT_TRUE(p.Publish(1, Key(42)).ok());
  ASSERT_TRUE(p.Free(got).ok());
  // Freed but still findable: a later request can hit it and take it back.
  EXPECT_EQ(p.Find(Key(42)), 1);
  ASSERT_TRUE(p.Acquire(1).ok());
  EXPECT_EQ(p.ref_count(1), 1);
  EXPECT_EQ(p.num_free(), 1);
  ASSERT_TRUE(p.Free(got).ok());
  p.TakeEvents();
  // Two allocations drain the list: block 2 first (older), then block 1 loses its identity.
  std::vector<int32_t> more;
  ASSERT_TRUE(p.Allocate(2, more).ok());
  EXPECT_EQ(more, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(p.Find(Key(42)), -1);
  EXPECT_FALSE(p.has_identity(1));
  const std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block, 1);
  EXPECT_EQ(events[0].key, Key(42));
  ExpectValid(p);
}

TEST(BlockPoolTest, PublishIsNamespacedAndKeepsTheFirstCopy) {
  BlockPool p = MakePool(5);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(3, got).ok());
  ASSERT_TRUE(p.Publish(1, Key(9, 0)).ok());
  ASSERT_TRUE(p.Publish(2, Key(9, 1)).ok());  // same digest, other group
  ASSERT_TRUE(p.Publish(3, Key(9, 0)).ok());  // duplicate of a held block: stays private
  EXPECT_EQ(p.Find(Key(9, 0)), 1);
  EXPECT_EQ(p.Find(Key(9, 1)), 2);
  EXPECT_FALSE(p.has_identity(3));
  EXPECT_EQ(p.num_cached(), 2);
  EXPECT_EQ(p.Publish(1, Key(10)).code(), StatusCode::kFailedPrecondition);
  const std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].key.group, 1);
  ExpectValid(p);
}

// Once the block holding a key is free, a newer copy published under it takes the key with its
// share level and continuations, and the old block, caching nothing, goes to the head; a copy
// not yet written (take_over off) leaves the key where it is.
TEST(BlockPoolTest, ANewerCopyTakesTheKeyFromAFreeBlock) {
  BlockPool p = MakePool(6);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(2, got).ok());  // blocks 1 and 2
  ASSERT_TRUE(p.Publish(1, Key(9)).ok());
  ASSERT_TRUE(p.MarkShared(1, 3).ok());
  ASSERT_TRUE(p.AddContinuation(1, 77).ok());
  ASSERT_TRUE(p.Free(std::vector<int32_t>{1, 2}).ok());  // free list: 3 4 5 1 2
  got.clear();
  ASSERT_TRUE(p.Allocate(2, got).ok());  // 3 and 4
  (void)p.TakeEvents();
  ASSERT_TRUE(p.Publish(3, Key(9), PublishOrigin{}, /*take_over=*/false).ok());
  EXPECT_EQ(p.Find(Key(9)), 1);
  EXPECT_FALSE(p.has_identity(3));
  ASSERT_TRUE(p.Publish(4, Key(9)).ok());
  EXPECT_EQ(p.Find(Key(9)), 4);
  EXPECT_FALSE(p.has_identity(1));
  EXPECT_EQ(p.share_level(4), 3);
  EXPECT_EQ(p.num_cached(), 1);
  EXPECT_EQ(p.num_free_cached(), 0);
  EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{1, 5, 2}));
  const std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block, 1);
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[1].block, 4);
  // A held holder keeps its key: 4 is held, so 3 stays private.
  ASSERT_TRUE(p.Publish(3, Key(9)).ok());
  EXPECT_EQ(p.Find(Key(9)), 4);
  EXPECT_FALSE(p.has_identity(3));
  ExpectValid(p);
}

TEST(BlockPoolTest, BadCallsAreRejectedAndChangeNothing) {
  BlockPool p = MakePool(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(2, got).ok());  // 1, 2
  ASSERT_TRUE(p.Acquire(1).ok());        // block 1 shared: ref 2
  const std::vector<int32_t> refs = {0, 2, 1, 0};
  const auto unchanged = [&] {
    EXPECT_TRUE(p.CheckInvariants(refs).ok()) << p.CheckInvariants(refs).message();
    EXPECT_EQ(p.FreeListOrder(), (std::vector<int32_t>{3}));
  };
  const std::vector<int32_t> double_free = {2, 2};
  EXPECT_NE(p.Free(double_free).message().find("block 2 listed 2 time(s)"), std::string::npos);
  unchanged();
  const std::vector<int32_t> partly_bad = {1, 9};
  EXPECT_NE(p.Free(partly_bad).message().find("block 9 is out of range"), std::string::npos);
  unchanged();
  const std::vector<int32_t> null_block = {0};
  EXPECT_NE(p.Free(null_block).message().find("null block"), std::string::npos);
  unchanged();
  const std::vector<int32_t> free_one = {3};
  EXPECT_EQ(p.Free(free_one).code(), StatusCode::kFailedPrecondition);  // already free
  unchanged();
  EXPECT_EQ(p.Acquire(3).code(), StatusCode::kFailedPrecondition);  // free, no identity
  EXPECT_EQ(p.Acquire(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Publish(3, Key(1)).code(), StatusCode::kFailedPrecondition);
  unchanged();
}

// Reacquire undoes a release exactly (the manager's refused allocation takes back what it gave
// up): cached or not, the blocks come back held and the rest of the free list is as before.
TEST(BlockPoolTest, ReacquireUndoesAReleaseExactly) {
  BlockPool p = MakePool(7);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(4, got).ok());  // 1..4
  ASSERT_TRUE(p.Publish(1, Key(1)).ok());
  ASSERT_TRUE(p.Publish(4, Key(4)).ok());
  const std::vector<int32_t> four = {4};
  ASSERT_TRUE(p.Free(four).ok());  // cached, at the tail
  const std::vector<int32_t> order = p.FreeListOrder();
  const std::vector<int32_t> released = {3, 1};
  ASSERT_TRUE(p.Free(released).ok());  // 3 (no identity) to the head, 1 to the tail
  EXPECT_EQ(p.Acquire(3).code(), StatusCode::kFailedPrecondition);  // a stranger may not
  ASSERT_TRUE(p.Reacquire(1).ok());
  ASSERT_TRUE(p.Reacquire(3).ok());
  EXPECT_EQ(p.FreeListOrder(), order);
  const std::vector<int32_t> refs = {0, 1, 1, 1, 0, 0, 0};
  EXPECT_TRUE(p.CheckInvariants(refs).ok()) << p.CheckInvariants(refs).message();
  ASSERT_TRUE(p.Reacquire(2).ok());  // held: one more reference
  EXPECT_EQ(p.ref_count(2), 2);
  EXPECT_EQ(p.Reacquire(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Reacquire(7).code(), StatusCode::kInvalidArgument);
  ExpectValid(p);
}

TEST(BlockPoolTest, ResetDropsEveryIdentityWithOneEvent) {
  BlockPool p = MakePool(4);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(2, got).ok());
  ASSERT_TRUE(p.Publish(1, Key(1)).ok());
  ASSERT_TRUE(p.Publish(2, Key(2)).ok());
  const std::vector<int32_t> one = {1};
  ASSERT_TRUE(p.Free(one).ok());
  p.TakeEvents();
  p.ResetPrefixCache();
  EXPECT_EQ(p.num_cached(), 0);
  EXPECT_EQ(p.Find(Key(1)), -1);
  EXPECT_EQ(p.Find(Key(2)), -1);
  const std::vector<KvEvent> events = p.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kCleared);
  ExpectValid(p);
}

TEST(BlockPoolTest, CheckerCatchesWrongHolderCounts) {
  BlockPool p = MakePool(3);
  std::vector<int32_t> got;
  ASSERT_TRUE(p.Allocate(1, got).ok());
  const std::vector<int32_t> right = {0, 1, 0};
  const std::vector<int32_t> wrong = {0, 2, 0};
  EXPECT_TRUE(p.CheckInvariants(right).ok());
  const Status s = p.CheckInvariants(wrong);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 1 has ref 1 but 2 holder(s)"), std::string::npos);
}

// A long random run against an obviously correct model: per-block holder counts, an ordered
// free list and a map of identities.
TEST(BlockPoolTest, RandomOperationsMatchAReferenceModel) {
  for (uint32_t seed : {7u, 8u, 9u, 10u}) {
    constexpr int32_t kBlocks = 64;
    BlockPool p = MakePool(kBlocks);
    std::mt19937 rng(seed);
    std::vector<int32_t> refs(kBlocks, 0);
    std::vector<int32_t> free_order;
    for (int32_t b = 1; b < kBlocks; ++b)
      free_order.push_back(b);
    std::map<std::pair<uint64_t, int32_t>, int32_t> identity;  // key -> block
    std::map<int32_t, std::pair<uint64_t, int32_t>> key_of;    // block -> key
    std::vector<int32_t> held;                                 // one entry per reference
    const auto drop = [&](int32_t b) {
      auto it = key_of.find(b);
      if (it == key_of.end()) return;
      identity.erase(it->second);
      key_of.erase(it);
    };
    for (int op = 0; op < 20000; ++op) {
      const uint32_t kind = rng() % 4;
      if (kind == 0) {
        const auto n = static_cast<int32_t>(rng() % 6);
        std::vector<int32_t> got;
        const Status s = p.Allocate(n, got);
        if (n > static_cast<int32_t>(free_order.size())) {
          ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
        } else {
          ASSERT_TRUE(s.ok());
          ASSERT_EQ(got, std::vector<int32_t>(free_order.begin(), free_order.begin() + n));
          free_order.erase(free_order.begin(), free_order.begin() + n);
          for (int32_t b : got) {
            drop(b);
            refs[static_cast<size_t>(b)] = 1;
            held.push_back(b);
          }
        }
      } else if (kind == 1 && !held.empty()) {
        const int32_t b = held[rng() % held.size()];
        const std::pair<uint64_t, int32_t> k{rng() % 40, static_cast<int32_t>(rng() % 2)};
        const Status s = p.Publish(b, {{k.first, k.first * 31 + 7}, k.second});
        if (key_of.count(b)) {
          ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
        } else {
          ASSERT_TRUE(s.ok());
          const auto it = identity.find(k);
          if (it != identity.end() && refs[static_cast<size_t>(it->second)] == 0) {
            // A free holder gives the key up and, worth nothing now, goes to the head.
            const int32_t old = it->second;
            key_of.erase(old);
            free_order.erase(std::find(free_order.begin(), free_order.end(), old));
            free_order.insert(free_order.begin(), old);
            identity.erase(it);
          }
          if (!identity.count(k)) {
            identity[k] = b;
            key_of[b] = k;
          }
        }
      } else if (kind == 2) {
        const std::pair<uint64_t, int32_t> k{rng() % 40, static_cast<int32_t>(rng() % 2)};
        const int32_t found = p.Find({{k.first, k.first * 31 + 7}, k.second});
        const auto it = identity.find(k);
        ASSERT_EQ(found, it == identity.end() ? -1 : it->second);
        if (found >= 0) {
          ASSERT_TRUE(p.Acquire(found).ok());
          if (refs[static_cast<size_t>(found)]++ == 0) {
            free_order.erase(std::find(free_order.begin(), free_order.end(), found));
          }
          held.push_back(found);
        }
      } else if (!held.empty()) {
        // Free a random subset of references, in random order.
        std::shuffle(held.begin(), held.end(), rng);
        const size_t n = 1 + rng() % std::min<size_t>(held.size(), 4);
        const std::vector<int32_t> victims(held.end() - static_cast<long>(n), held.end());
        held.resize(held.size() - n);
        ASSERT_TRUE(p.Free(victims).ok());
        for (int32_t b : victims) {
          if (--refs[static_cast<size_t>(b)] == 0) free_order.push_back(b);
        }
      }
      const Status check = p.CheckInvariants(refs);
      ASSERT_TRUE(check.ok()) << "seed " << seed << " op " << op << ": " << check.message();
      ASSERT_EQ(p.FreeListOrder(), free_order);
      ASSERT_EQ(p.num_cached(), static_cast<int32_t>(identity.size()));
    }
    ASSERT_TRUE(p.Free(held).ok());
    EXPECT_EQ(p.num_free(), kBlocks - 1);
  }
}

}  // namespace
}  // namespace hkv
