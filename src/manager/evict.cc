// Evict: a sparse-KV policy's decision for one group (FullAttentionGroup::Evict applies it; other
// kinds refuse).
#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Result<EvictResult> KvCacheManager::Impl::Evict(Request& r, int32_t g, int64_t keep,
                                                int64_t unchanged) {
  if (g < 0 || static_cast<size_t>(g) >= groups.size()) {
    return Status::InvalidArgument(fmt::format(
        "evict: request {}: group {} out of range (the model has {})", r.id, g, groups.size()));
  }
  return group(static_cast<size_t>(g)).Evict(r, keep, unchanged);
}

Result<EvictResult> KvCacheManager::Evict(RequestId id, int32_t group, int64_t keep,
                                          int64_t unchanged) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("evict", id);
  impl_->ForgetFreeSteps();
  Result<EvictResult> out = impl_->Evict(*r, group, keep, unchanged);
  impl_->core.SettleDrops();
  return out;
}

}  // namespace hkv
