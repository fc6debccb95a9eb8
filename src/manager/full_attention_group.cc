// FullAttentionGroup: every block before a position is needed; hits count cached blocks from the
// front; Evict packs a sparse-KV policy's kept tokens into the table's first slots.
#include <algorithm>

#include <fmt/format.h>

#include "token_group.h"

namespace hkv::manager_internal {

NeededBlocks FullAttentionGroup::Needed(int64_t x) const {
  NeededBlocks n;
  if (x > 0) n.hi = math_.Block(x + math_.tokens() - 1);
  return n;
}

int64_t FullAttentionGroup::LookupBound(const Request& r, int64_t x, int64_t cap) {
  // Full attention needs the whole prefix: count cached blocks from the front once.
  const int64_t bs = block_tokens();
  if (cached_prefix_ < 0) {
    const BlockPool& bp = block_pool();
    const int64_t limit = cap / bs;
    TokenSlot& ts = slot_at(r.slot);
    ts.found.clear();
    ts.found_epoch = bp.identity_epoch();
    cached_prefix_ = 0;
    int32_t b = -1;
    while (cached_prefix_ < limit && core_.Available(bp, Key(r, cached_prefix_), &b)) {
      ts.found.push_back(b);
      ++cached_prefix_;
    }
  }
  return std::min(x, cached_prefix_ * bs / core_.align * core_.align);
}

bool FullAttentionGroup::BranchReach(const Request& r, int64_t cap, int64_t hit, int64_t& reach,
                                     bool& held) const {
  const BlockPool& bp = block_pool();
  const int64_t bs = block_tokens();
  const int64_t limit = cap / bs;
  const TokenSlot& ts = slot_at(r.slot);
  int64_t m = 0;
  while (m < limit && ts.FoundOr(bp, static_cast<size_t>(m), Key(r, m)) >= 0)
    ++m;
  reach = std::min(reach, m * bs);
  if (held) {
    const int64_t j = hit / bs - 1;
    const int32_t last = ts.FoundOr(bp, static_cast<size_t>(j), Key(r, j));
    held = last >= 0 && bp.ref_count(last) > 0;
  }
  return true;
}

namespace {

bool Shared(const BlockPool& bp, int32_t b) {
  return bp.ref_count(b) > 1 || bp.has_identity(b);
}

// Blocks in table[from, to) the engine would write although others hold or can hit them.
int64_t CountShared(const BlockPool& bp, const std::vector<int32_t>& table, size_t from, size_t to,
                    size_t& first) {
  int64_t n = 0;
  for (size_t j = from; j < to; ++j) {
    if (Shared(bp, table[j])) {
      ++n;
      first = std::min(first, j);
    }
  }
  return n;
}

}  // namespace

Result<EvictResult> FullAttentionGroup::Evict(Request& r, int64_t keep, int64_t unchanged) {
  const int32_t g = group_;
  if (r.step_open) {
    return Status::FailedPrecondition(
        fmt::format("evict: request {} has an open step [{}, {}); commit it first", r.id,
                    r.step_begin, r.step_end));
  }
  TokenSlot& ts = slot_at(r.slot);
  const int64_t n = r.computed - ts.evicted;
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
  const int64_t bs = block_tokens();
  const int64_t lookahead = r.reserved - r.computed;
  const auto new_blocks = static_cast<size_t>(CeilDiv(keep + lookahead, bs));
  const auto stay = static_cast<size_t>(unchanged / bs);
  BlockPool& bp = block_pool();
  size_t first_replaced = new_blocks;
  const int64_t replace = CountShared(bp, ts.table, stay, new_blocks, first_replaced);
  if (replace > 0) {
    std::fill(core_.need.begin(), core_.need.end(), 0);
    core_.need[static_cast<size_t>(pool())] = replace;
    core_.hit_keep.clear();
    const Status reserved = core_.ReserveBlocks();
    if (!reserved.ok()) {
      ++core_.stats.allocations_failed;
      return Status::ResourceExhausted(fmt::format(
          "evict: request {} group {}: {} private block(s) needed for the kept tokens: {}", r.id, g,
          replace, reserved.message()));
    }
  }

  // Apply. Replacements are allocated while every old block is still held, so none of them is
  // one whose bytes the engine has yet to read.
  // Released tail first, as Free does, so a cached prefix's head outlives its tail in the LRU.
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (size_t j = ts.table.size(); j > new_blocks; --j)
    to_release.push_back(ts.table[j - 1]);
  out.blocks_released = static_cast<int32_t>(to_release.size());
  ts.table.resize(new_blocks);
  ts.Touch(new_blocks);
  if (replace > 0) {
    ts.Touch(first_replaced);
    const std::span<const int32_t> fresh = core_.AllocateReserved(pool(), replace);
    size_t k = 0;
    const size_t tail = to_release.size();
    for (size_t j = first_replaced; j < new_blocks; ++j) {
      int32_t& b = ts.table[j];
      if (Shared(bp, b)) {
        to_release.push_back(b);
        b = fresh[k++];
      }
    }
    std::reverse(to_release.begin() + static_cast<std::ptrdiff_t>(tail), to_release.end());
  }
  out.blocks_replaced = static_cast<int32_t>(replace);
  core_.Release(pool(), to_release, r.retention);
  out.write_from = std::min(unchanged, static_cast<int64_t>(first_replaced) * bs);
  // Blocks from the first one written on now hold slots, not the positions a digest names.
  ts.num_published = std::min<int32_t>(ts.num_published, static_cast<int32_t>(out.write_from / bs));
  ts.evicted += n - keep;
  r.publish_until = std::min(r.publish_until, r.computed);
  return out;
}

}  // namespace hkv::manager_internal
