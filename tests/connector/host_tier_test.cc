// HostTier: LRU eviction order, pinning, capacity, refusals that change nothing, and random
// sequences of every call against a simple model of the contract.
#include <algorithm>
#include <map>

#include <gtest/gtest.h>

#include <hkv/common/splitmix64.h>
#include <hkv/connector/host_tier.h>

namespace hkv {
namespace {

PrefixKey K(uint64_t n) {
  return PrefixKey{BlockHash{n, n * 3}, static_cast<int32_t>(n % 2)};
}
std::vector<unsigned char> Bytes(size_t n, unsigned char fill) {
  return std::vector<unsigned char>(n, fill);
}

TEST(HostTierTest, EvictsLeastRecentlyUsedFirst) {
  HostTier tier(300);
  for (uint64_t k = 1; k <= 3; ++k)
    ASSERT_TRUE(tier.Put(K(k), Bytes(100, static_cast<unsigned char>(k))).ok());
  ASSERT_TRUE(tier.Get(K(1)).ok());  // 2 is now the oldest
  EXPECT_TRUE(tier.Contains(K(3)));  // Contains does not count as a use
  ASSERT_TRUE(tier.Put(K(4), Bytes(100, 4)).ok());
  EXPECT_FALSE(tier.Contains(K(2)));
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(3), K(1), K(4)}));
  ASSERT_TRUE(tier.Put(K(5), Bytes(200, 5)).ok());  // takes 3 and 1
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(4), K(5)}));
  EXPECT_EQ(tier.used_bytes(), 300);
  EXPECT_EQ(*tier.Get(K(4)), Bytes(100, 4));
}

TEST(HostTierTest, PinnedEntriesAreNeverEvicted) {
  HostTier tier(200);
  ASSERT_TRUE(tier.Put(K(1), Bytes(100, 1)).ok());
  ASSERT_TRUE(tier.Put(K(2), Bytes(100, 2)).ok());
  ASSERT_TRUE(tier.Pin(K(1)).ok());
  ASSERT_TRUE(tier.Put(K(3), Bytes(100, 3)).ok());  // skips pinned 1, takes 2
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(1), K(3)}));
  EXPECT_EQ(tier.Evict(K(1)).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier.Pin(K(3)).ok());
  // Everything pinned: the Put is refused and nothing is evicted.
  const Status s = tier.Put(K(4), Bytes(50, 4));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(1), K(3)}));
  ASSERT_TRUE(tier.Unpin(K(1)).ok());
  EXPECT_EQ(tier.Unpin(K(1)).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier.Put(K(4), Bytes(50, 4)).ok());
  EXPECT_FALSE(tier.Contains(K(1)));
}

TEST(HostTierTest, RefusalsChangeNothing) {
  HostTier tier(100);
  ASSERT_TRUE(tier.Put(K(1), Bytes(60, 1)).ok());
  const Status big = tier.Put(K(2), Bytes(101, 2));
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("101 bytes"), std::string::npos);
  EXPECT_EQ(tier.LruOrder(), std::vector<PrefixKey>{K(1)});
  EXPECT_EQ(tier.used_bytes(), 60);
  EXPECT_EQ(tier.Get(K(2)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.Pin(K(2)).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.Unpin(K(2)).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.Evict(K(2)).code(), StatusCode::kNotFound);
  // A key held already keeps its bytes: identities name content.
  ASSERT_TRUE(tier.Put(K(1), Bytes(10, 9)).ok());
  EXPECT_EQ(*tier.Get(K(1)), Bytes(60, 1));
  EXPECT_EQ(tier.used_bytes(), 60);
}

// The contract restated as plainly as possible: a vector in LRU order.
struct Model {
  struct E {
    PrefixKey key;
    std::vector<unsigned char> bytes;
    int pins = 0;
  };
  int64_t capacity;
  std::vector<E> lru;

  int64_t Used() const {
    int64_t u = 0;
    for (const E& e : lru)
      u += static_cast<int64_t>(e.bytes.size());
    return u;
  }
  std::vector<E>::iterator Find(const PrefixKey& k) {
    return std::find_if(lru.begin(), lru.end(), [&](const E& e) { return e.key == k; });
  }
  void Touch(std::vector<E>::iterator it) {
    E e = *it;
    lru.erase(it);
    lru.push_back(e);
  }
  bool Put(const PrefixKey& k, const std::vector<unsigned char>& b) {
    if (auto it = Find(k); it != lru.end()) {
      Touch(it);
      return true;
    }
    int64_t free = capacity - Used();
    for (const E& e : lru)
      free += e.pins == 0 ? static_cast<int64_t>(e.bytes.size()) : 0;
    if (free < static_cast<int64_t>(b.size())) return false;
    while (capacity - Used() < static_cast<int64_t>(b.size())) {
      lru.erase(std::find_if(lru.begin(), lru.end(), [](const E& e) { return e.pins == 0; }));
    }
    lru.push_back(E{k, b, 0});
    return true;
  }
};

TEST(HostTierTest, RandomSequencesMatchTheModel) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SplitMix64 rng(seed);
    const int64_t capacity = 200 + rng.Below(800);
    HostTier tier(capacity);
    Model model{capacity, {}};
    for (int step = 0; step < 2000; ++step) {
      const PrefixKey k = K(static_cast<uint64_t>(rng.Below(24)));
      auto it = model.Find(k);
      const bool held = it != model.lru.end();
      switch (rng.Below(6)) {
        case 0:
        case 1: {
          const auto b =
              Bytes(static_cast<size_t>(rng.Below(300)), static_cast<unsigned char>(rng.Next()));
          ASSERT_EQ(tier.Put(k, b).ok(), model.Put(k, b)) << seed << "/" << step;
          break;
        }
        case 2: {
          Result<std::vector<unsigned char>> got = tier.Get(k);
          ASSERT_EQ(got.ok(), held);
          if (held) {
            ASSERT_EQ(*got, it->bytes);
            model.Touch(it);
          }
          break;
        }
        case 3:
          ASSERT_EQ(tier.Pin(k).ok(), held);
          if (held) ++it->pins;
          break;
        case 4: {
          const bool ok = held && it->pins > 0;
          ASSERT_EQ(tier.Unpin(k).ok(), ok);
          if (ok) --it->pins;
          break;
        }
        case 5: {
          const bool ok = held && it->pins == 0;
          ASSERT_EQ(tier.Evict(k).ok(), ok);
          if (ok) model.lru.erase(it);
          break;
        }
      }
      std::vector<PrefixKey> keys;
      for (const Model::E& e : model.lru)
        keys.push_back(e.key);
      ASSERT_EQ(tier.LruOrder(), keys) << seed << "/" << step;
      ASSERT_EQ(tier.used_bytes(), model.Used());
      ASSERT_LE(tier.used_bytes(), capacity);
    }
  }
}

}  // namespace
}  // namespace hkv
