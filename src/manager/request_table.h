// RequestTable: RequestId -> request slot, an open-addressing hash map with linear probing.
//
// Contract: Find returns the slot stored for an id or -1; Insert requires the id to be absent;
// Erase requires it to be present. Capacity doubles when the table is half full, so steady state
// (as many requests arriving as leaving) never allocates. Deletion shifts later entries back
// instead of leaving tombstones, so lookups stay short however many requests come and go.
// Every public manager call starts with a Find, several per running request and step, so Find
// is inline and an entry keeps its id and slot together (one cache line read per probe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hkv::manager_internal {

class RequestTable {
 public:
  RequestTable();

  int32_t Find(uint64_t id) const {
    for (size_t i = Home(id);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.slot < 0) return -1;
      if (e.id == id) return e.slot;
    }
  }
  void Insert(uint64_t id, int32_t slot);
  void Erase(uint64_t id);
  int32_t size() const { return size_; }

 private:
  struct Entry {
    uint64_t id = 0;
    int32_t slot = -1;  // -1: empty
  };

  size_t Home(uint64_t id) const {
    // Engines often number requests consecutively; a multiplicative mix spreads them anyway.
    uint64_t h = id * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return static_cast<size_t>(h) & mask_;
  }
  void Grow();

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int32_t size_ = 0;
};

}  // namespace hkv::manager_internal
