// FutureUse: a trace's future as an eviction rank — what the simulator's `oracle` mode evicts by.
//
// Contract: built from a whole trace before it is replayed, it knows every prompt's prefix
// digests (chained as the manager chains them, every hash_tokens tokens, up to the prompt's last
// token but one: the longest prefix a hit can take). Rank(digest) is Belady's order in the
// replay's own time, the trace order in which its first-come first-served scheduler admits
// requests: the sooner the next request not yet admitted needs the prefix, the higher the rank;
// among prefixes needed by the same request, the shorter ranks higher (a hit needs a prefix's
// start before its end); a prefix no waiting or future request needs ranks lowest. The replayer
// calls Consume when it admits a request (its prefixes are then next needed by a later one) and
// Return when it preempts one (needed again at its re-admission), and hands the returned digests
// to KvCacheManager::Rerank. It is an upper bound in spirit, not a proven optimum: Belady's rule
// is optimal for one cache of equal-sized items, while here a hit needs every group's blocks and
// a recurrent state at one position, and pages of different classes share slabs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/eviction_rank.h>
#include <hkv/sim/trace.h>

namespace hkv {

class FutureUse final : public EvictionRank {
 public:
  // Errors: hash_tokens < 1.
  static Result<std::shared_ptr<FutureUse>> Create(const Trace& trace, int32_t hash_tokens);

  uint64_t Rank(const BlockHash& digest) const override;
  // Request i (trace order) was admitted; the digests of its prompt, whose ranks changed.
  std::span<const BlockHash> Consume(size_t i);
  // Request i went back to waiting (preempted); the digests whose ranks changed.
  std::span<const BlockHash> Return(size_t i);
  // The request index that next needs the prefix (trace.size() when none does).
  int64_t NextUse(const BlockHash& digest) const;

 private:
  struct Entry {
    int32_t depth = 0;           // the prefix is depth * hash_tokens tokens long
    int64_t begin = 0, end = 0;  // its users: users_[begin, end), ascending request indices
    int64_t cursor = 0;          // users_ before it are all admitted
  };
  struct Slot {
    BlockHash digest;
    int32_t entry = -1;  // -1: empty
  };
  int32_t FindEntry(const BlockHash& digest) const;
  int64_t NextUseOf(int32_t entry) const;  // entry -1: none
  int32_t InsertEntry(const BlockHash& digest);

  int64_t num_requests_ = 0;
  std::vector<std::vector<BlockHash>> digests_;  // per request, in prefix order
  std::vector<Entry> entries_;
  std::vector<int32_t> users_;
  std::vector<uint8_t> admitted_;
  std::vector<Slot> table_;  // open addressing, at most half full
  size_t mask_ = 0;
};

}  // namespace hkv
