// BlockPool: the blocks (pages) of one page class, their reference counts, the free list and the
// prefix index.
//
// Contract:
// - Block ids are [0, num_blocks). Block 0 is the null block: never allocated, freed or
//   published; block tables use it for positions a layer no longer keeps.
// - Every other block is exactly one of: free (ref 0, on the free list) or held (ref > 0).
// - The free list is in eviction order. Allocate takes from its head; Free appends to its tail
//   in the order given, so a caller that passes a request's tail blocks first has them evicted
//   first. Free with Retention::kLow puts the blocks at the head instead (still in the order
//   given), for blocks worth nothing (no identity) or of low-priority requests. Eviction is
//   lazy: a free block keeps its prefix identity, and Find still returns it, until Allocate takes
//   it for new data; then its identity is dropped (a `removed` event).
// - A prefix key maps to at most one block and a block has at most one key.
// - Every call that returns a failed Status has changed nothing.
// Metadata is struct-of-arrays, sized once; steady-state calls do not allocate (events aside).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/prefix_index.h>

namespace hkv {

enum class Retention : unsigned char {
  kNormal,  // free-list tail: evicted after every block freed before
  kLow,     // free-list head: evicted before every other free block
};

struct KvEvent {
  enum class Kind : unsigned char { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  PrefixKey key;      // unused for kCleared
  int32_t block = 0;  // unused for kCleared
};

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  // num_blocks counts the null block, so at least 2. Events can be switched off for benchmarks.
  static Result<BlockPool> Create(int32_t num_blocks, bool record_events = true);

  // Appends n fresh blocks (ref 1) to `out`, all or nothing.
  Status Allocate(int32_t n, std::vector<int32_t>& out);
  // The block holding `key`, held or free, or -1.
  int32_t Find(const PrefixKey& key) const { return index_.Find(key); }
  // One more reference to a held block, or takes a free block that still has its identity (a
  // prefix hit) off the free list.
  Status Acquire(int32_t block);
  // Gives a held block its prefix identity. If another block already has the key the index is
  // left as it is and the call succeeds: the caller's copy stays private.
  Status Publish(int32_t block, const PrefixKey& key);
  // Drops one reference per listed block (a block may be listed as often as it is referenced).
  // Blocks that become free are queued for eviction in the order listed, at the tail or, with
  // Retention::kLow, at the head of the free list.
  Status Free(std::span<const int32_t> blocks, Retention retention = Retention::kNormal);
  // Drops every prefix identity (held and free blocks alike) and emits one `cleared` event.
  void ResetPrefixCache();

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t num_cached() const { return index_.size(); }
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }
  bool has_identity(int32_t block) const { return has_key_[static_cast<size_t>(block)] != 0; }
  // The block's prefix key; meaningful only while has_identity(block).
  const PrefixKey& identity(int32_t block) const { return key_[static_cast<size_t>(block)]; }
  // Blocks in eviction order (the next Allocate takes them from the front).
  std::vector<int32_t> FreeListOrder() const;
  std::vector<KvEvent> TakeEvents();

  // Checks every invariant of the contract; the second form also compares reference counts with
  // the holders the caller knows of (entry 0 is ignored). Names the first violation.
  Status CheckInvariants() const;
  Status CheckInvariants(std::span<const int32_t> expected_ref_counts) const;

 private:
  BlockPool(int32_t num_blocks, bool record_events);
  Status CheckBlockId(int32_t block, const char* call) const;
  void Unlink(int32_t block);
  void Append(int32_t block);
  void Prepend(int32_t block);
  void DropIdentity(int32_t block);
  void Record(KvEvent::Kind kind, const PrefixKey& key, int32_t block);

  std::vector<int32_t> ref_;
  std::vector<int32_t> prev_, next_;  // free-list links, -1 at the ends
  std::vector<uint8_t> on_list_;
  std::vector<PrefixKey> key_;
  std::vector<uint8_t> has_key_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0;
  PrefixIndex index_;
  bool record_events_ = true;
  std::vector<KvEvent> events_;
  std::vector<int32_t> pending_;  // Free's validation: times listed per block, kept all zero
};

}  // namespace hkv
