// Prefix digests: chained, sensitive to every input that changes the cache, unambiguous.
#include <cstring>
#include <unordered_set>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/pool/block_hash.h>

namespace hkv {
namespace {

const std::vector<int32_t> kBlock = {11, 22, 33, 44};

TEST(BlockHashTest, IsDeterministicAndChained) {
  const BlockHash a = HashBlock(kRootHash, kBlock);
  EXPECT_EQ(a, HashBlock(kRootHash, kBlock));
  EXPECT_NE(a, kRootHash);
  // The same tokens under a different parent are a different prefix.
  const BlockHash b = HashBlock(a, kBlock);
  EXPECT_NE(a, b);
  EXPECT_NE(b, HashBlock(HashBlock(kRootHash, {{11, 22, 33, 45}}), kBlock));
}

// Digests name blocks in stored tiers and in events other processes keep, so they must not
// change between versions: these values were computed before the common case got its own path
// (parent and tokens only, up to 128 tokens), and the longer block takes the general one.
TEST(BlockHashTest, DigestsAreStableAcrossVersions) {
  std::vector<int32_t> t16, t128, t129;
  for (int i = 0; i < 16; ++i)
    t16.push_back(1000 + 7 * i);
  for (int i = 0; i < 129; ++i)
    (i < 128 ? t128 : t129).push_back(i * 31);
  t129.insert(t129.begin(), t128.begin(), t128.end());
  const BlockHash a = HashBlock(kRootHash, t16);
  EXPECT_EQ(a, (BlockHash{0xbc39ce23aff9d5d2ull, 0x0c6e19c2985eca8eull}));
  EXPECT_EQ(HashBlock(a, t16), (BlockHash{0x13d1a38538cd8ddeull, 0x9ce5228bc0436061ull}));
  EXPECT_EQ(HashBlock(kRootHash, t128), (BlockHash{0x9d8fb1836f71a935ull, 0x3f51faa1e8e8a4adull}));
  EXPECT_EQ(HashBlock(kRootHash, {}), (BlockHash{0x66d1aaa55e7b4028ull, 0x002947813d7d8e96ull}));
  EXPECT_EQ(HashBlock(kRootHash, t129), (BlockHash{0xea02e5b8a7e62071ull, 0xb92f9ffc9a800290ull}));
}

TEST(BlockHashTest, TokenOrderAndCountMatter) {
  EXPECT_NE(HashBlock(kRootHash, kBlock), HashBlock(kRootHash, {{22, 11, 33, 44}}));
  EXPECT_NE(HashBlock(kRootHash, kBlock), HashBlock(kRootHash, {{11, 22, 33}}));
  EXPECT_NE(HashBlock(kRootHash, {}), HashBlock(kRootHash, {{0}}));
}

TEST(BlockHashTest, ExtraKeysIsolateAdaptersTenantsAndImages) {
  const BlockHash base = HashBlock(kRootHash, kBlock);
  BlockExtraKeys lora;
  lora.adapter_id = 7;
  EXPECT_NE(base, HashBlock(kRootHash, kBlock, lora));
  lora.adapter_id = 8;
  EXPECT_NE(HashBlock(kRootHash, kBlock, lora), HashBlock(kRootHash, kBlock, {7, {}, {}}));

  BlockExtraKeys salted;
  salted.cache_salt = "tenant-a";
  EXPECT_NE(base, HashBlock(kRootHash, kBlock, salted));
  BlockExtraKeys other;
  other.cache_salt = "tenant-b";
  EXPECT_NE(HashBlock(kRootHash, kBlock, salted), HashBlock(kRootHash, kBlock, other));

  const MultimodalItem at0{{1, 2}, 0};
  const MultimodalItem at2{{1, 2}, 2};
  const MultimodalItem other_image{{3, 4}, 0};
  EXPECT_NE(base, HashBlock(kRootHash, kBlock, {0, {&at0, 1}, {}}));
  EXPECT_NE(HashBlock(kRootHash, kBlock, {0, {&at0, 1}, {}}),
            HashBlock(kRootHash, kBlock, {0, {&at2, 1}, {}}));
  EXPECT_NE(HashBlock(kRootHash, kBlock, {0, {&at0, 1}, {}}),
            HashBlock(kRootHash, kBlock, {0, {&other_image, 1}, {}}));
}

TEST(BlockHashTest, FieldsCannotBeConfusedForEachOther) {
  // Token 3 as a fifth token versus a salt whose bytes spell the same little-endian value.
  const std::vector<int32_t> five = {11, 22, 33, 44, 3};
  char salt_bytes[8] = {};
  salt_bytes[0] = 3;
  BlockExtraKeys salted;
  salted.cache_salt = std::string_view(salt_bytes, 8);
  EXPECT_NE(HashBlock(kRootHash, five), HashBlock(kRootHash, kBlock, salted));
  // An adapter id versus an extra token of the same value.
  BlockExtraKeys lora;
  lora.adapter_id = 3;
  EXPECT_NE(HashBlock(kRootHash, five), HashBlock(kRootHash, kBlock, lora));
}

TEST(BlockHashTest, NoCollisionsOverManyChains) {
  std::unordered_set<PrefixKey, PrefixKeyHash> seen;
  std::vector<int32_t> tokens(16);
  uint32_t x = 12345;
  for (int chain = 0; chain < 200; ++chain) {
    BlockHash parent = kRootHash;
    for (int block = 0; block < 250; ++block) {
      for (int32_t& t : tokens) {
        x = x * 1664525u + 1013904223u;
        t = static_cast<int32_t>(x % 50);  // a tiny vocabulary makes near-duplicates common
      }
      parent = HashBlock(parent, tokens);
      ASSERT_TRUE(seen.insert({parent, 0}).second) << chain << "/" << block;
    }
  }
}

TEST(BlockHashTest, PrefixKeysAreNamespacedByGroup) {
  const BlockHash h = HashBlock(kRootHash, kBlock);
  EXPECT_NE((PrefixKey{h, 0}), (PrefixKey{h, 1}));
  EXPECT_NE(PrefixKeyHash{}({h, 0}), PrefixKeyHash{}({h, 1}));
}

}  // namespace
}  // namespace hkv
