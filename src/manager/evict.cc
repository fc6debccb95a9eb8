// Evict: a sparse-KV policy's decision applied to a full-attention group — the kept tokens packed
// into the table's first slots, whole blocks past them returned to the pools.
#include <algorithm>

#include <fmt/format.h>

#include "manager_impl.h"

namespace hkv {

Result<EvictResult> KvCacheManager::Impl::Evict(Request& r, int32_t g, int64_t keep,
                                                int64_t unchanged) {
  if (g < 0 || static_cast<size_t>(g) >= config.groups.size()) {
    return Status::InvalidArgument(
        fmt::format("evict: request {}: group {} out of range (the "
                    "model has {})",
                    r.id, g, config.groups.size()));
  }
  const GroupConfig& gc = config.groups[static_cast<size_t>(g)];
  if (gc.rule.kind != TokenRuleKind::kAll) {
    return Status::InvalidArgument(
        fmt::format("evict: request {}: group {} keeps tokens by its {} rule; only full-attention "
                    "groups evict by policy",
                    r.id, g, TokenRuleKindName(gc.rule.kind)));
  }
  if (r.step_open) {
    return Status::FailedPrecondition(
        fmt::format("evict: request {} has an open step [{}, {}); commit it first", r.id,
                    r.step_begin, r.step_end));
  }
  GroupState& gs = r.groups[static_cast<size_t>(g)];
  const int64_t n = r.computed - gs.evicted;
  if (keep < 0 || keep > n) {
    return Status::InvalidArgument(fmt::format(
        "evict: request {} group {}: keep {}: expected 0 to the {} slots the group holds", r.id, g,
        keep, n));
  }
  if (unchanged < 0 || unchanged > keep) {
    return Status::InvalidArgument(
        fmt::format("evict: request {} group {}: {} unchanged: expected 0 to keep ({})", r.id, g,
                    unchanged, keep));
  }
  EvictResult out{keep, keep, 0, 0};
  if (keep == n) return out;  // every slot stays where it is

  // Plan: which blocks the engine writes into must be private. Nothing changes until the pool is
  // known to supply their replacements.
  const int64_t bs = gc.block_tokens;
  const int64_t lookahead = r.reserved - r.computed;
  const auto new_blocks = static_cast<size_t>(CeilDiv(keep + lookahead, bs));
  const auto stay = static_cast<size_t>(unchanged / bs);
  BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
  int64_t replace = 0;
  size_t first_replaced = new_blocks;
  for (size_t j = stay; j < new_blocks; ++j) {
    const int32_t b = gs.table[j];
    if (bp.ref_count(b) > 1 || bp.has_identity(b)) {
      ++replace;
      first_replaced = std::min(first_replaced, j);
    }
  }
  if (replace > 0) {
    std::fill(need.begin(), need.end(), 0);
    need[static_cast<size_t>(gc.pool)] = replace;
    hit_keep.clear();
    const Status reserved = ReserveBlocks();
    if (!reserved.ok()) {
      ++stats.allocations_failed;
      return Status::ResourceExhausted(fmt::format(
          "evict: request {} group {}: {} private block(s) needed for the kept tokens: {}", r.id, g,
          replace, reserved.message()));
    }
  }

  // Apply. Replacements are allocated while every old block is still held, so none of them is
  // one whose bytes the engine has yet to read.
  // Released tail first, as Free does, so a cached prefix's head outlives its tail in the LRU.
  to_release.clear();
  for (size_t j = gs.table.size(); j > new_blocks; --j)
    to_release.push_back(gs.table[j - 1]);
  out.blocks_released = static_cast<int32_t>(to_release.size());
  gs.table.resize(new_blocks);
  if (replace > 0) {
    fresh.clear();
    Must(bp.Allocate(static_cast<int32_t>(replace), fresh));
    size_t k = 0;
    const size_t tail = to_release.size();
    for (size_t j = first_replaced; j < new_blocks; ++j) {
      int32_t& b = gs.table[j];
      if (bp.ref_count(b) > 1 || bp.has_identity(b)) {
        to_release.push_back(b);
        b = fresh[k++];
      }
    }
    std::reverse(to_release.begin() + static_cast<std::ptrdiff_t>(tail), to_release.end());
  }
  out.blocks_replaced = static_cast<int32_t>(replace);
  Release(gc.pool, to_release, r.retention);
  out.write_from = std::min(unchanged, static_cast<int64_t>(first_replaced) * bs);
  // Blocks from the first one written on now hold slots, not the positions a digest names.
  gs.num_published = std::min<int32_t>(gs.num_published, static_cast<int32_t>(out.write_from / bs));
  gs.evicted += n - keep;
  r.publish_until = std::min(r.publish_until, r.computed);
  return out;
}

Result<EvictResult> KvCacheManager::Evict(RequestId id, int32_t group, int64_t keep,
                                          int64_t unchanged) {
  Request* r = impl_->Find(id);
  if (r == nullptr) return impl_->Unknown("evict", id);
  return impl_->Evict(*r, group, keep, unchanged);
}

}  // namespace hkv
