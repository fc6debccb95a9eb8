// PrefixIndex: the map from prefix identity to the block that holds it.
//
// Contract: an open-addressing table (linear probing, backward-shift deletion) kept at most half
// full for the entries it was reserved for, so Find/Insert/Erase are O(1) expected. It allocates
// only in the constructor and in Reserve, never in Find/Insert/Erase: its owner reserves room
// for every block it may hold identities on before publishing them (a pool of a slab arena
// reserves as it gains slabs, so its table is sized for the pages it has owned, not for every
// slab it could own — a table twice as large costs cache misses on every probe). Keys are
// unique: Insert of a present key is a programming error; Emplace checks and inserts with one
// probe. Used by the pool part, and by the manager's thrash guard for the chain ends it
// remembers.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/common/prefetch.h>
#include <hkv/pool/block_hash.h>

namespace hkv {

class PrefixIndex {
 public:
  explicit PrefixIndex(int32_t max_entries);

  // Grows the table (rehashing every entry) when it is sized for fewer than max_entries.
  void Reserve(int32_t max_entries);

  int32_t Find(const PrefixKey& key) const;  // block id, or -1
  // Starts loading the slot where a Find of key begins, for callers that know the keys they will
  // look up next: a probe of a table larger than the caches is a memory round trip, and a loop
  // that prefetches a few keys ahead overlaps them.
  void Prefetch(const PrefixKey& key) const;
  void Insert(const PrefixKey& key, int32_t block);
  // Inserts key -> block when key is absent and returns -1; otherwise returns the block that
  // holds key and changes nothing.
  int32_t Emplace(const PrefixKey& key, int32_t block);
  bool Erase(const PrefixKey& key);  // false when absent
  void Clear();
  int32_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }

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
  static size_t CapacityFor(int32_t max_entries);
  size_t Home(const PrefixKey& key) const { return PrefixKeyHash{}(key)&mask_; }
  size_t Probe(
      const PrefixKey& key) const;  // the slot holding key, or the empty slot ending its run

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int32_t size_ = 0;
};

inline void PrefixIndex::Prefetch(const PrefixKey& key) const {
  PrefetchLine(slots_[Home(key)]);
}

}  // namespace hkv
