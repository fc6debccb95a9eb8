// BranchMemory: the prefixes where requests were seen to branch, remembered after their blocks
// are evicted (ManagerConfig::branch_memory_entries).
//
// A window model keeps the window blocks of a branch point (a shared system prompt) only while
// the cache shows the branch: its full-attention prefix cached beyond a request's hit, or held
// by another running request. Once every request using the prefix has ended and the prefix was
// evicted, the next request to compute it again saw nothing and released its window blocks as
// they left its window, and the requests after it missed the prefix although its full-attention
// blocks were still held. The memory keeps the digest of each branch position, so that request
// keeps the window there too.
//
// Contract: a direct-mapped table of `entries` digests (rounded up to a power of two; 0: off, it
// remembers nothing). A new digest overwrites the one in its slot, so the memory is bounded and
// lossy: Contains answers true only for a digest that was remembered and not overwritten since.
// No allocation after construction; Remember and Contains are O(1).
//
// Private to src/manager.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include <hkv/pool/block_hash.h>

namespace hkv::manager_internal {

class BranchMemory {
 public:
  explicit BranchMemory(int32_t entries)
      : slots_(entries > 0 ? std::bit_ceil(static_cast<uint32_t>(entries)) : 0),
        mask_(slots_.empty() ? 0 : slots_.size() - 1) {}

  bool enabled() const { return !slots_.empty(); }
  void Clear() { std::fill(slots_.begin(), slots_.end(), BlockHash{}); }
  void Remember(const BlockHash& h) {
    if (enabled()) slots_[h.lo & mask_] = h;
  }
  // The zero digest marks an empty slot; no chain digest of real tokens is zero in practice.
  bool Contains(const BlockHash& h) const {
    return enabled() && !(h == BlockHash{}) && slots_[h.lo & mask_] == h;
  }

 private:
  std::vector<BlockHash> slots_;
  uint64_t mask_;
};

}  // namespace hkv::manager_internal
