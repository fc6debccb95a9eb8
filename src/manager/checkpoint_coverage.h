// CheckpointCoverage: for a model whose hits need a recurrent checkpoint at the hit position, how
// many cached checkpoints each attention prefix block serves.
//
// Why: a full-attention block is worth something to such a model only while some cached
// checkpoint at or after its end lies on a prefix through it - a hit stops at a checkpoint, so
// attention KV past the last one is never read again - and a checkpoint is worth something only
// while every attention block before it is cached. Recency alone keeps the two apart (they live
// in different page classes with different eviction orders), and memory fills with states whose
// KV is gone and KV whose states are gone. The manager uses this count to evict them together.
//
// Contract: Cover(chain, branch) counts one more checkpoint at the end of `chain` (the prefix
// digests of a request up to the checkpoint, in order, at the hash granularity); Uncover(digest)
// counts one fewer for the checkpoint whose prefix ends at `digest`, walking the stored parent
// links to the root, and reports each digest no checkpoint covers any more, deepest first.
// Count(digest) is the number of cached checkpoints whose prefix includes it. Digests are shared by
// every group (PrefixKey adds the group), so one chain serves all attention groups. Memory: one
// entry per covered digest, shared between checkpoints with a common prefix (a PrefixIndex maps
// digests to entries); both grow when needed and never shrink, so steady state allocates nothing.
//
// Private to src/manager.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/prefix_index.h>

namespace hkv::manager_internal {

class CheckpointCoverage {
 public:
  CheckpointCoverage();

  // `branch`: the checkpoint sits where prefixes branch (a request diverged there from a cached
  // prefix); the mark stays on its digest while anything covers it.
  void Cover(std::span<const BlockHash> chain, bool branch);
  // Appends the digests left uncovered to `uncovered`. A digest that is not covered (a
  // checkpoint this table never saw) changes nothing.
  void Uncover(const BlockHash& end, std::vector<BlockHash>& uncovered);
  int32_t Count(const BlockHash& digest) const;
  // How many covered digests continue the prefix ending at `digest`: 0 at a leaf, 1 on a path
  // that does not branch, more at a branch point.
  int32_t Children(const BlockHash& digest) const;
  bool IsBranch(const BlockHash& digest) const;
  void Clear();
  int64_t size() const { return index_.size(); }

  // Every entry has a positive count, at least that of each child, and as many children as
  // entries name it their parent.
  Status CheckInvariants() const;

 private:
  struct Entry {
    BlockHash digest;
    BlockHash parent;
    int32_t count = 0;     // 0: a free entry
    int32_t children = 0;  // entries naming this one their parent
    bool branch = false;   // a checkpoint was published here as a branch point
  };
  // The entry of a digest, or -1. The project's prefix table maps digest -> entry (group 0).
  int32_t Find(const BlockHash& d) const { return index_.Find({d, 0}); }
  int32_t Add(const BlockHash& d, const BlockHash& parent);
  void Remove(int32_t e);

  PrefixIndex index_{32};
  std::vector<Entry> entries_;
  std::vector<int32_t> free_;  // entries to reuse
};

}  // namespace hkv::manager_internal
