// ManagerProbe: read-only views into a KvCacheManager's pools for tests, fuzzers and debugging
// engines - not part of what an engine needs to drive the manager, so not on its class.
//
// Contract: every call only reads; a pool index outside the manager's pools gives an empty list
// (FreeListOrder) or kInvalidArgument with `out` unchanged (UncachedFreeBlocks).
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/manager/kv_cache_manager.h>

namespace hkv {

class ManagerProbe {
 public:
  // Free blocks of one pool in eviction order.
  static std::vector<int32_t> FreeListOrder(const KvCacheManager& manager, int32_t pool);
  // Appends the free blocks of `pool` that hold no prefix identity: no request may read what
  // they contain, so a debugging engine may poison them (a later read of stale data then shows).
  static Status UncachedFreeBlocks(const KvCacheManager& manager, int32_t pool,
                                   std::vector<int32_t>& out);
};

}  // namespace hkv
