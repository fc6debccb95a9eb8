// HostTier: the Tier in host memory - a hash map of byte strings beside the index.
//
// Contract: as Tier (hkv/connector/tier.h); capacity counts the stored bytes only.
#pragma once

#include <unordered_map>

#include <hkv/connector/tier_index.h>

namespace hkv {

class HostTier final : public IndexedTier {
 public:
  explicit HostTier(int64_t capacity_bytes) : IndexedTier("host tier", capacity_bytes) {}

  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;
  std::string_view medium() const override { return "CPU"; }

 private:
  std::unordered_map<PrefixKey, std::vector<unsigned char>, PrefixKeyHash> bytes_;
};

}  // namespace hkv
