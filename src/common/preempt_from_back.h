// AllocateOrPreempt: the preemption rule every scheduler of this repository follows (replay.md's
// in both replays, and the reference engine's): a request that cannot get blocks preempts the
// newest running request, the back of the running list, and tries again, until it gets them or
// is itself the newest, when it yields. The oldest running request therefore always progresses.
//
// Private to the repository's sources (src/sim/step_loop.h, src/engine/engine.cc), not an API:
// another engine chooses its own victims. It sits in common's folder because it needs nothing
// but Status, below both of its users.
#pragma once

#include <memory>

#include <hkv/common/result.h>
#include <hkv/common/status.h>

namespace hkv::common_internal {

// Tries `allocate()` (returning a Status) for `r`; while it fails with kResourceExhausted,
// `preempt(victim, refusal)` (returning a Status) must take `victim`, the back of `running` (a
// container of raw or owning pointers that holds `r`), out of it, and the allocation is tried
// again. Whether `r` got its blocks: false when `r` itself was the victim. Any other failure of
// either call is returned as it is.
template <typename Running, typename Request, typename Allocate, typename Preempt>
Result<bool> AllocateOrPreempt(const Running& running, const Request* r, Allocate&& allocate,
                               Preempt&& preempt) {
  for (;;) {
    const Status st = allocate();
    if (st.ok()) return true;
    if (st.code() != StatusCode::kResourceExhausted) return st;
    Request* victim = std::to_address(running.back());
    const bool self = victim == r;
    HKV_RETURN_IF_ERROR(preempt(victim, st));
    if (self) return false;
  }
}

}  // namespace hkv::common_internal
