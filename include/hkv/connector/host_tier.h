// HostTier: the Tier in host memory - a hash map of entries and an intrusive LRU list.
//
// Contract: as Tier (hkv/connector/tier.h); capacity counts the stored bytes only.
#pragma once

#include <list>
#include <unordered_map>

#include <hkv/connector/tier.h>

namespace hkv {

class HostTier final : public Tier {
 public:
  explicit HostTier(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  bool Contains(const PrefixKey& key) const override { return entries_.contains(key); }
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Pin(const PrefixKey& key) override;
  Status Unpin(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;

  int64_t capacity_bytes() const override { return capacity_; }
  int64_t used_bytes() const override { return used_; }
  std::vector<PrefixKey> LruOrder() const override { return {lru_.begin(), lru_.end()}; }

 private:
  struct Entry {
    std::vector<unsigned char> bytes;
    std::list<PrefixKey>::iterator lru;
    int32_t pins = 0;
  };
  void Touch(Entry& e) { lru_.splice(lru_.end(), lru_, e.lru); }

  int64_t capacity_ = 0;
  int64_t used_ = 0;
  std::unordered_map<PrefixKey, Entry, PrefixKeyHash> entries_;
  std::list<PrefixKey> lru_;  // least recently used first
};

}  // namespace hkv
