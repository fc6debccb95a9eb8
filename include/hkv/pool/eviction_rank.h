// EvictionRank: an eviction order given by the caller instead of recency.
//
// Contract: a pool given a rank (BlockPool::set_eviction_rank) queues every cached block it frees
// to the tail by the block's rank instead of by when it was freed: the free list stays sorted,
// lowest rank first (evicted first), ties in the order freed. Blocks worth nothing (no identity,
// freed to the head, demoted) still go ahead of every ranked block. A rank may change between
// calls, for instance as a simulated clock advances; the owner then tells the pool which blocks'
// ranks changed (BlockPool::Rerank), and the pool requeues them. Rank is called only with a
// block's digest, so it must not depend on the group or the block id. Ranks must stay below 2^63,
// and a rank of 0 counts as 1 (0 marks blocks queued at the head).
//
// The simulator's `oracle` mode is the user: it ranks a prefix by how soon a future request of
// the trace needs it (sim/future_use.h), which makes every pool evict Belady-style.
#pragma once

#include <cstdint>

#include <hkv/pool/block_hash.h>

namespace hkv {

class EvictionRank {
 public:
  virtual ~EvictionRank() = default;
  // The worth of keeping the prefix ending in `digest` cached: larger is evicted later.
  virtual uint64_t Rank(const BlockHash& digest) const = 0;
};

}  // namespace hkv
