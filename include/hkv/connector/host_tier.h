// HostTier: the Tier in host memory - a hash map of byte strings beside a TierIndex.
//
// Contract: as Tier (hkv/connector/tier.h); capacity counts the stored bytes only.
#pragma once

#include <unordered_map>

#include <hkv/connector/tier.h>
#include <hkv/connector/tier_index.h>

namespace hkv {

class HostTier final : public Tier {
 public:
  explicit HostTier(int64_t capacity_bytes) : index_("host tier", capacity_bytes) {}

  bool Contains(const PrefixKey& key) const override { return index_.Contains(key); }
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Pin(const PrefixKey& key) override { return index_.Pin(key); }
  Status Unpin(const PrefixKey& key) override { return index_.Unpin(key); }
  Status Evict(const PrefixKey& key) override;

  int64_t capacity_bytes() const override { return index_.capacity_bytes(); }
  int64_t used_bytes() const override { return index_.used_bytes(); }
  std::vector<PrefixKey> LruOrder() const override { return index_.LruOrder(); }

 private:
  TierIndex index_;
  std::unordered_map<PrefixKey, std::vector<unsigned char>, PrefixKeyHash> bytes_;
};

}  // namespace hkv
