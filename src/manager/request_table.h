// RequestTable: RequestId -> request slot, an open-addressing hash map with linear probing.
//
// Contract: Find returns the slot stored for an id or -1; Insert requires the id to be absent;
// Erase requires it to be present. Capacity doubles when the table is half full, so steady state
// (as many requests arriving as leaving) never allocates. Deletion shifts later entries back
// instead of leaving tombstones, so lookups stay short however many requests come and go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hkv::manager_internal {

class RequestTable {
 public:
  RequestTable();

  int32_t Find(uint64_t id) const;
  void Insert(uint64_t id, int32_t slot);
  void Erase(uint64_t id);
  int32_t size() const { return size_; }

 private:
  size_t Home(uint64_t id) const;
  void Grow();

  std::vector<uint64_t> ids_;
  std::vector<int32_t> slots_;  // -1: empty
  size_t mask_ = 0;
  int32_t size_ = 0;
};

}  // namespace hkv::manager_internal
