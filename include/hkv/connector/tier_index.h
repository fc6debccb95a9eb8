// TierIndex: the bookkeeping every Tier shares - which keys are held, their sizes, pins, the LRU
// order and the byte budget - without the bytes themselves, which each tier keeps its own way.
//
// Contract: the index never stores data. A tier asks it what a Put must evict (Victims) and
// whether a Pin, Unpin or Evict is allowed, then tells it what was done (Insert, Erase, Touch).
// Victims changes nothing, so a tier can refuse a Put, or fail to store it, with the index as it
// was. Refusals are Statuses naming the tier (given at construction), the key and the reason.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/connector/tier.h>
#include <hkv/pool/block_hash.h>

namespace hkv {

// "<hi><lo>/group <g>" in hex: how tier messages name a key.
std::string TierKeyName(const PrefixKey& key);

class TierIndex {
 public:
  TierIndex(std::string tier_name, int64_t capacity_bytes)
      : name_(std::move(tier_name)), capacity_(capacity_bytes) {}

  bool Contains(const PrefixKey& key) const { return entries_.contains(key); }
  // Bytes of a held key.
  int64_t bytes(const PrefixKey& key) const { return entries_.at(key).bytes; }
  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_; }
  std::vector<PrefixKey> LruOrder() const { return {lru_.begin(), lru_.end()}; }

  // Makes a held key the most recently used.
  void Touch(const PrefixKey& key);
  // The unpinned entries, least recently used first, whose removal makes room for `bytes` more
  // (none when they fit already); ResourceExhausted when even all of them are not enough.
  Result<std::vector<PrefixKey>> Victims(const PrefixKey& key, int64_t bytes) const;
  // Adds a key not held, as the most recently used.
  void Insert(const PrefixKey& key, int64_t bytes);
  // Removes a held key, pinned or not (and notes it when tracking).
  void Erase(const PrefixKey& key);
  void TrackDropped(bool on) { track_ = on; }
  void TakeDropped(std::vector<PrefixKey>& out) {
    out.insert(out.end(), dropped_.begin(), dropped_.end());
    dropped_.clear();
  }

  Status Pin(const PrefixKey& key);
  Status Unpin(const PrefixKey& key);
  // Ok when `key` is held and unpinned, so Evict may remove it; NotFound or FailedPrecondition.
  Status CheckEvict(const PrefixKey& key) const;
  // The NotFound of a Get of a key not held.
  Status Miss(const PrefixKey& key) const;

 private:
  struct Entry {
    int64_t bytes = 0;
    std::list<PrefixKey>::iterator lru;
    int32_t pins = 0;
  };

  std::string name_;
  int64_t capacity_ = 0;
  int64_t used_ = 0;
  std::unordered_map<PrefixKey, Entry, PrefixKeyHash> entries_;
  std::list<PrefixKey> lru_;  // least recently used first
  bool track_ = false;
  std::vector<PrefixKey> dropped_;
};

// What a tier built on a TierIndex answers from the index alone; the tier adds where the bytes
// live (Put, Get, Evict).
class IndexedTier : public Tier {
 public:
  bool Contains(const PrefixKey& key) const final { return index_.Contains(key); }
  Status Pin(const PrefixKey& key) final { return index_.Pin(key); }
  Status Unpin(const PrefixKey& key) final { return index_.Unpin(key); }
  int64_t capacity_bytes() const final { return index_.capacity_bytes(); }
  int64_t used_bytes() const final { return index_.used_bytes(); }
  std::vector<PrefixKey> LruOrder() const final { return index_.LruOrder(); }
  void TrackDropped(bool on) final { index_.TrackDropped(on); }
  void TakeDropped(std::vector<PrefixKey>& out) final { index_.TakeDropped(out); }

 protected:
  IndexedTier(std::string tier_name, int64_t capacity_bytes)
      : index_(std::move(tier_name), capacity_bytes) {}

  TierIndex index_;
};

}  // namespace hkv
