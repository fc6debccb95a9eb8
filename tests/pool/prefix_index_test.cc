// The open-addressing prefix index agrees with std::unordered_map over long random sequences.
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/prefix_index.h>

namespace hkv {
namespace {

TEST(PrefixIndexTest, AgreesWithAReferenceMap) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    constexpr int32_t kMax = 500;
    PrefixIndex index(kMax);
    std::unordered_map<PrefixKey, int32_t, PrefixKeyHash> reference;
    std::mt19937 rng(seed);
    // Few distinct hashes and groups, so probe runs collide and wrap around often.
    const auto random_key = [&] {
      return PrefixKey{{rng() % 700, 0}, static_cast<int32_t>(rng() % 3)};
    };
    for (int op = 0; op < 50000; ++op) {
      const PrefixKey key = random_key();
      const auto it = reference.find(key);
      ASSERT_EQ(index.Find(key), it == reference.end() ? -1 : it->second);
      if (rng() % 2 == 0 && it == reference.end() &&
          static_cast<int32_t>(reference.size()) < kMax) {
        const auto block = static_cast<int32_t>(rng() % 10000);
        index.Insert(key, block);
        reference[key] = block;
      } else {
        ASSERT_EQ(index.Erase(key), it != reference.end());
        reference.erase(key);
      }
      ASSERT_EQ(index.size(), static_cast<int32_t>(reference.size()));
    }
    int32_t visited = 0;
    index.ForEach([&](const PrefixKey& k, int32_t b) {
      ++visited;
      ASSERT_EQ(reference.at(k), b);
    });
    EXPECT_EQ(visited, index.size());
    index.Clear();
    EXPECT_EQ(index.size(), 0);
    for (const auto& [k, b] : reference)
      EXPECT_EQ(index.Find(k), -1);
  }
}

// Grown in steps while full of colliding keys (as a pool of a slab arena grows it when it gains
// slabs), with Emplace's one-probe insert: every entry survives each rehash, Emplace reports the
// holder of a present key and leaves it, and the table stays at most half full.
TEST(PrefixIndexTest, GrowsWithoutLosingEntriesAndEmplaceKeepsTheFirstHolder) {
  for (uint32_t seed : {4u, 5u}) {
    PrefixIndex index(4);
    EXPECT_EQ(index.capacity(), 8u);
    std::unordered_map<PrefixKey, int32_t, PrefixKeyHash> reference;
    std::mt19937 rng(seed);
    const auto random_key = [&] {
      return PrefixKey{{rng() % 900, 0}, static_cast<int32_t>(rng() % 2)};
    };
    int32_t limit = 4;
    for (int op = 0; op < 40000; ++op) {
      if (op % 5000 == 4999 && limit < 600) {
        limit = limit * 3 + 1;
        index.Reserve(limit);
        ASSERT_GE(index.capacity(), 2 * static_cast<size_t>(limit));
        index.Reserve(limit / 2);  // never shrinks
        ASSERT_GE(index.capacity(), 2 * static_cast<size_t>(limit));
        for (const auto& [k, b] : reference)
          ASSERT_EQ(index.Find(k), b);
      }
      const PrefixKey key = random_key();
      const auto it = reference.find(key);
      if (rng() % 2 == 0 && static_cast<int32_t>(reference.size()) < limit) {
        const auto block = static_cast<int32_t>(rng() % 10000);
        ASSERT_EQ(index.Emplace(key, block), it == reference.end() ? -1 : it->second);
        reference.emplace(key, block);  // a present key keeps its first block
      } else {
        ASSERT_EQ(index.Erase(key), it != reference.end());
        reference.erase(key);
      }
      ASSERT_EQ(index.size(), static_cast<int32_t>(reference.size()));
    }
    EXPECT_GT(limit, 500);
    for (const auto& [k, b] : reference)
      EXPECT_EQ(index.Find(k), b);
  }
}

}  // namespace
}  // namespace hkv
