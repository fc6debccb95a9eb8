// PrefixIndex: the map from prefix identity to the block that holds it.
//
// Contract: an open-addressing table (linear probing, backward-shift deletion) sized once for at
// most `max_entries` entries, so Find/Insert/Erase are O(1) expected and never allocate after
// construction. Keys are unique: Insert of a present key is a programming error (the pool checks
// with Find first). Private to the pool part, exposed for its tests.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/pool/block_hash.h>

namespace hkv {

class PrefixIndex {
 public:
  explicit PrefixIndex(int32_t max_entries);

  int32_t Find(const PrefixKey& key) const;  // block id, or -1
  void Insert(const PrefixKey& key, int32_t block);
  bool Erase(const PrefixKey& key);  // false when absent
  void Clear();
  int32_t size() const { return size_; }

  // Calls f(key, block) for every entry, in table order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.block >= 0) f(s.key, s.block);
    }
  }

 private:
  struct Slot {
    PrefixKey key;
    int32_t block = -1;  // -1: empty
  };
  size_t Home(const PrefixKey& key) const { return PrefixKeyHash{}(key)&mask_; }
  size_t Probe(
      const PrefixKey& key) const;  // the slot holding key, or the empty slot ending its run

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int32_t size_ = 0;
};

}  // namespace hkv
