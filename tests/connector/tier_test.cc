// Every Tier (HostTier, DiskTier, RemoteTier on a real Redis server): LRU eviction order, pinning,
// capacity, refusals that change nothing, and random sequences of every call against a simple model
// of the contract - for the disk tier with files damaged behind its back among the calls.
#include <algorithm>
#include <memory>

#include <gtest/gtest.h>

#include <hkv/common/splitmix64.h>
#include <hkv/connector/disk_tier.h>
#include <hkv/connector/host_tier.h>
#include <hkv/connector/remote_tier.h>

#include "redis_server.h"
#include "tier_test_util.h"

namespace hkv {
namespace {

using testing::Bytes;
using testing::K;

class TierTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool OnDisk() const { return std::string_view(GetParam()) == "Disk"; }
  bool OnRemote() const { return std::string_view(GetParam()) == "Remote"; }
  // A new empty tier; the disk one in a fresh directory (a disk tier reloads what it finds), the
  // remote one in a fresh namespace of the test binary's Redis server.
  std::unique_ptr<Tier> Make(int64_t capacity) {
    disk_ = nullptr;
    if (OnRemote()) {
      // The Tier contract's eviction deletes: the remote tier as the sole owner of its entries.
      RemoteTierOptions o =
          testing::SharedRedisServer().Options(testing::FreshNamespace("tiertest"), capacity);
      o.ownership = RemoteTierOptions::Ownership::kTier;
      auto t = RemoteTier::Connect(o);
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      return std::move(t).value();
    }
    if (!OnDisk()) return std::make_unique<HostTier>(capacity);
    Result<DiskTier> t =
        DiskTier::Open(dir_.path() / std::to_string(++made_), testing::DiskOptions(capacity));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    auto tier = std::make_unique<DiskTier>(std::move(t).value());
    disk_ = tier.get();
    return tier;
  }

  testing::ScopedTempDir dir_;
  int made_ = 0;
  DiskTier* disk_ = nullptr;
};

TEST_P(TierTest, EvictsLeastRecentlyUsedFirst) {
  auto tier = Make(300);
  for (uint64_t k = 1; k <= 3; ++k)
    ASSERT_TRUE(tier->Put(K(k), Bytes(100, static_cast<unsigned char>(k))).ok());
  ASSERT_TRUE(tier->Get(K(1)).ok());  // 2 is now the oldest
  EXPECT_TRUE(tier->Contains(K(3)));  // Contains does not count as a use
  ASSERT_TRUE(tier->Put(K(4), Bytes(100, 4)).ok());
  EXPECT_FALSE(tier->Contains(K(2)));
  EXPECT_EQ(tier->LruOrder(), (std::vector<PrefixKey>{K(3), K(1), K(4)}));
  ASSERT_TRUE(tier->Put(K(5), Bytes(200, 5)).ok());  // takes 3 and 1
  EXPECT_EQ(tier->LruOrder(), (std::vector<PrefixKey>{K(4), K(5)}));
  EXPECT_EQ(tier->used_bytes(), 300);
  EXPECT_EQ(*tier->Get(K(4)), Bytes(100, 4));
}

TEST_P(TierTest, PinnedEntriesAreNeverEvicted) {
  auto tier = Make(200);
  ASSERT_TRUE(tier->Put(K(1), Bytes(100, 1)).ok());
  ASSERT_TRUE(tier->Put(K(2), Bytes(100, 2)).ok());
  ASSERT_TRUE(tier->Pin(K(1)).ok());
  ASSERT_TRUE(tier->Put(K(3), Bytes(100, 3)).ok());  // skips pinned 1, takes 2
  EXPECT_EQ(tier->LruOrder(), (std::vector<PrefixKey>{K(1), K(3)}));
  EXPECT_EQ(tier->Evict(K(1)).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier->Pin(K(3)).ok());
  // Everything pinned: the Put is refused and nothing is evicted.
  const Status s = tier->Put(K(4), Bytes(50, 4));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->LruOrder(), (std::vector<PrefixKey>{K(1), K(3)}));
  ASSERT_TRUE(tier->Unpin(K(1)).ok());
  EXPECT_EQ(tier->Unpin(K(1)).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier->Put(K(4), Bytes(50, 4)).ok());
  EXPECT_FALSE(tier->Contains(K(1)));
  EXPECT_EQ(*tier->Get(K(3)), Bytes(100, 3));
}

TEST_P(TierTest, RefusalsChangeNothing) {
  auto tier = Make(100);
  ASSERT_TRUE(tier->Put(K(1), Bytes(60, 1)).ok());
  const Status big = tier->Put(K(2), Bytes(101, 2));
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("101 bytes"), std::string::npos);
  EXPECT_EQ(tier->LruOrder(), std::vector<PrefixKey>{K(1)});
  EXPECT_EQ(tier->used_bytes(), 60);
  EXPECT_EQ(tier->Get(K(2)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Pin(K(2)).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Unpin(K(2)).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->Evict(K(2)).code(), StatusCode::kNotFound);
  // A key held already keeps its bytes: identities name content.
  ASSERT_TRUE(tier->Put(K(1), Bytes(10, 9)).ok());
  EXPECT_EQ(*tier->Get(K(1)), Bytes(60, 1));
  EXPECT_EQ(tier->used_bytes(), 60);
}

TEST_P(TierTest, EmptyEntriesAreStoredToo) {
  auto tier = Make(0);
  ASSERT_TRUE(tier->Put(K(1), {}).ok());
  Result<std::vector<unsigned char>> got = tier->Get(K(1));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->empty());
}

// The contract restated as plainly as possible: a vector in LRU order. `damaged` marks an
// entry whose file was damaged: the tier still lists it until a Get finds the damage.
struct Model {
  struct E {
    PrefixKey key;
    std::vector<unsigned char> bytes;
    int pins = 0;
    bool damaged = false;
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
    lru.push_back(E{k, b, 0, false});
    return true;
  }
};

TEST_P(TierTest, RandomSequencesMatchTheModel) {
  // A server round trip per call: fewer sequences on the remote tier.
  const uint64_t seeds = OnRemote() ? 3 : 20;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    SplitMix64 rng(seed);
    const int64_t capacity = 200 + rng.Below(800);
    auto tier = Make(capacity);
    Model model{capacity, {}};
    int64_t damaged = 0;
    for (int step = 0; step < 2000; ++step) {
      const PrefixKey k = K(static_cast<uint64_t>(rng.Below(24)));
      auto it = model.Find(k);
      const bool held = it != model.lru.end();
      // Call 6, damaging a file, exists only on disk; elsewhere it is a batch (7) too.
      int op = static_cast<int>(rng.Below(8));
      if (op == 6 && !OnDisk()) op = 7;
      switch (op) {
        case 0:
        case 1: {
          const auto b =
              Bytes(static_cast<size_t>(rng.Below(300)), static_cast<unsigned char>(rng.Next()));
          ASSERT_EQ(tier->Put(k, b).ok(), model.Put(k, b)) << seed << "/" << step;
          break;
        }
        case 2: {
          Result<std::vector<unsigned char>> got = tier->Get(k);
          const bool hit = held && !it->damaged;
          ASSERT_EQ(got.ok(), hit) << seed << "/" << step << " " << got.status().ToString();
          if (hit) {
            ASSERT_EQ(*got, it->bytes);
            model.Touch(it);
          } else {
            ASSERT_EQ(got.status().code(), StatusCode::kNotFound);
            if (held) {  // the damage is found: the entry goes, whatever its pins
              ++damaged;
              model.lru.erase(it);
            }
          }
          break;
        }
        case 3:
          ASSERT_EQ(tier->Pin(k).ok(), held);
          if (held) ++it->pins;
          break;
        case 4: {
          const bool ok = held && it->pins > 0;
          ASSERT_EQ(tier->Unpin(k).ok(), ok);
          if (ok) --it->pins;
          break;
        }
        case 5: {
          const bool ok = held && it->pins == 0;
          ASSERT_EQ(tier->Evict(k).ok(), ok);
          if (ok) model.lru.erase(it);
          break;
        }
        case 7: {
          // The batch calls answer as the single ones would, in order.
          const PrefixKey ks[3] = {k, K(rng.Below(24)), K(rng.Below(24))};
          unsigned char has[3] = {9, 9, 9};
          tier->ContainsMany(ks, has);
          for (int i = 0; i < 3; ++i)
            ASSERT_EQ(has[i] != 0, model.Find(ks[i]) != model.lru.end()) << seed << "/" << step;
          const auto b0 =
              Bytes(static_cast<size_t>(rng.Below(300)), static_cast<unsigned char>(rng.Next()));
          const auto b1 =
              Bytes(static_cast<size_t>(rng.Below(300)), static_cast<unsigned char>(rng.Next()));
          const std::span<const unsigned char> values[2] = {b0, b1};
          Status put[2];
          tier->PutMany(std::span(ks).first(2), values, put);
          ASSERT_EQ(put[0].ok(), model.Put(ks[0], b0)) << seed << "/" << step;
          ASSERT_EQ(put[1].ok(), model.Put(ks[1], b1)) << seed << "/" << step;
          break;
        }
        case 6:
          if (held && !it->damaged) {
            const testing::Damage d = testing::kDamages[rng.Below(3)];
            testing::DamageFile(disk_->PathOf(k), d, rng.Next());
            it->damaged = true;
          }
          break;
      }
      std::vector<PrefixKey> keys;
      for (const Model::E& e : model.lru)
        keys.push_back(e.key);
      ASSERT_EQ(tier->LruOrder(), keys) << seed << "/" << step;
      ASSERT_EQ(tier->used_bytes(), model.Used());
      ASSERT_LE(tier->used_bytes(), capacity);
    }
    if (disk_ != nullptr) {
      EXPECT_GT(damaged, 0) << seed;  // the sequence did find damage
      EXPECT_EQ(disk_->corruptions_detected(), damaged) << seed;
      // No file outlives its entry, and no temporary file is left.
      std::vector<std::filesystem::path> expected;
      for (const Model::E& e : model.lru)
        expected.push_back(disk_->PathOf(e.key));
      int64_t files = 0;
      for (const auto& f : std::filesystem::directory_iterator(disk_->dir())) {
        const std::string name = f.path().filename().string();
        if (name == "LOCK" || name == "MODEL") continue;
        ++files;
        EXPECT_NE(std::find(expected.begin(), expected.end(), f.path()), expected.end())
            << f.path();
      }
      EXPECT_LE(files, static_cast<int64_t>(model.lru.size()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, TierTest, ::testing::Values("Host", "Disk", "Remote"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

}  // namespace
}  // namespace hkv
