// Tier: a store of exported blocks (block streams) keyed by prefix identity, with a byte budget.
//
// Contract: entries are byte strings under a PrefixKey; an identity names content, so a Put of a
// key already held keeps the stored bytes and only marks the entry used. Get and Put make an
// entry the most recently used; Contains does not. To fit a Put, the least recently used
// unpinned entries are evicted, oldest first; a Put that cannot fit even then (larger than the
// capacity, or the room is pinned) is refused with nothing evicted. Pinned entries (Pin counts,
// Unpin undoes one) are never evicted, by a Put or by Evict. Every refusal is a Status naming the
// key and the reason and leaves the tier as it was.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/block_hash.h>

namespace hkv {

class Tier {
 public:
  virtual ~Tier() = default;

  virtual bool Contains(const PrefixKey& key) const = 0;
  virtual Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) = 0;
  // Whether a call costs a round trip, so that callers should batch (ContainsMany and the rest).
  virtual bool Remote() const { return false; }
  // out[i] = 1 when the tier contains keys[i].
  virtual void ContainsMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const {
    for (size_t i = 0; i < keys.size(); ++i)
      out[i] = Contains(keys[i]) ? 1 : 0;
  }
  // out: one Get per key, in order.
  virtual void GetMany(std::span<const PrefixKey> keys,
                       std::vector<Result<std::vector<unsigned char>>>& out) {
    out.clear();
    for (const PrefixKey& k : keys)
      out.push_back(Get(k));
  }
  // out[i] = the Status of putting values[i] under keys[i].
  virtual void PutMany(std::span<const PrefixKey> keys,
                       std::span<const std::span<const unsigned char>> values,
                       std::span<Status> out) {
    for (size_t i = 0; i < keys.size(); ++i)
      out[i] = Put(keys[i], values[i]);
  }
  // The stored bytes; NotFound on a miss.
  virtual Result<std::vector<unsigned char>> Get(const PrefixKey& key) = 0;
  virtual Status Pin(const PrefixKey& key) = 0;
  virtual Status Unpin(const PrefixKey& key) = 0;
  // Removes an unpinned entry; NotFound if absent, FailedPrecondition if pinned.
  virtual Status Evict(const PrefixKey& key) = 0;

  // The medium KV events name for this tier's stores and removals ("CPU", "DISK", "REMOTE").
  virtual std::string_view medium() const { return "TIER"; }
  // With tracking on, the keys whose entries left the tier (evicted, found damaged, gone from a
  // server) are kept until TakeDropped appends them to `out`, oldest first.
  virtual void TrackDropped(bool) {}
  virtual void TakeDropped(std::vector<PrefixKey>&) {}

  virtual int64_t capacity_bytes() const = 0;
  virtual int64_t used_bytes() const = 0;
  // Every key, least recently used first.
  virtual std::vector<PrefixKey> LruOrder() const = 0;
};

}  // namespace hkv
