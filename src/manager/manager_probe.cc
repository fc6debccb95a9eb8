#include <fmt/format.h>

#include <hkv/manager/manager_probe.h>

#include "manager_impl.h"

namespace hkv {

std::vector<int32_t> ManagerProbe::FreeListOrder(const KvCacheManager& manager, int32_t pool) {
  const auto& pools = manager.impl_->core.pools;
  if (pool < 0 || static_cast<size_t>(pool) >= pools.size()) return {};
  return pools[static_cast<size_t>(pool)].FreeListOrder();
}

Status ManagerProbe::UncachedFreeBlocks(const KvCacheManager& manager, int32_t pool,
                                        std::vector<int32_t>& out) {
  const auto& pools = manager.impl_->core.pools;
  if (pool < 0 || static_cast<size_t>(pool) >= pools.size()) {
    return Status::InvalidArgument(
        fmt::format("uncached free blocks: pool {} outside [0, {})", pool, pools.size()));
  }
  const BlockPool& bp = pools[static_cast<size_t>(pool)];
  for (int32_t b : bp.FreeListOrder()) {
    if (!bp.has_identity(b)) out.push_back(b);
  }
  return Status::Ok();
}

}  // namespace hkv
