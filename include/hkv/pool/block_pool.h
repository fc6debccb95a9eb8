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
// - Blocks come in segments of segment_blocks() consecutive ids (block b is in segment
//   (b - 1) / segment_blocks()). A pool made by Create owns its one segment for life. A pool made
//   by CreateSegmented starts owning none: the level above (SlabArena) hands it segments with
//   AddSegment and takes back segments none of whose blocks is held with RemoveSegment. Blocks of
//   segments the pool does not own are dormant: neither free nor held, not allocatable.
// - Owned segments with no held block are kept in two lists ordered by when they last became
//   empty: those holding no prefix identity (plain free memory) and those still caching some.
//   Free-list entries and empty segments carry ticks of one eviction clock, which pools of one
//   arena share, so their ages compare across pools.
// - MoveHeld(src, dst) hands a held block's references and prefix identity to a free block, for
//   compaction: afterwards the caller must hold dst wherever it held src, and the contents must be
//   copied by whoever owns the memory. The prefix index then maps the key to dst. MoveCached does
//   the same for a free cached block, which keeps its place in the eviction order.
// - With an eviction rank (set_eviction_rank), blocks freed to the tail queue by rank instead of
//   by time (eviction_rank.h): ticks are then ranks, the free list stays sorted by them, and an
//   empty segment's tick is the highest rank it caches, so the arena compares worth, not age.
// - With a branch bonus (set_branch_bonus), blocks of shared prefixes are queued behind blocks
//   freed after them, by their share level; the list is sorted by tick as with a rank, and an
//   empty segment is as young as the youngest bonus it queues.
// Metadata is struct-of-arrays, sized once; steady-state calls do not allocate (events aside).
// The prefix index is the exception that keeps it small: a segmented pool grows it in AddSegment
// when it owns more pages than ever before (so once its share of the arena has settled, never).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/eviction_rank.h>
#include <hkv/pool/kv_event.h>
#include <hkv/pool/prefix_index.h>
#include <hkv/pool/retention.h>

namespace hkv {

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  // num_blocks counts the null block, so at least 2. Events can be switched off for benchmarks.
  static Result<BlockPool> Create(int32_t num_blocks, bool record_events = true);
  // A pool of num_segments * segment_blocks blocks (plus the null block) that owns no segment
  // yet. `clock` is the eviction clock; pools sharing one have comparable ticks.
  static Result<BlockPool> CreateSegmented(int32_t num_segments, int32_t segment_blocks,
                                           std::shared_ptr<uint64_t> clock,
                                           bool record_events = true);

  // Appends n fresh blocks (ref 1) to `out`, all or nothing, in eviction order. With packing on
  // (set_pack_segments), blocks worth nothing (no identity, or queued at the head) are
  // interchangeable, so while the head is one of them Allocate takes one in the segment it took
  // the previous one from, if there is one: a class's held blocks then gather in few segments
  // instead of one in every segment, and the arena can give whole segments to other classes.
  Status Allocate(int32_t n, std::vector<int32_t>& out);
  // Packing (segmented pools of an arena with several classes); off by default.
  void set_pack_segments(bool on) {
    pack_ = on;
    fill_ = -1;
  }
  bool pack_segments() const { return pack_; }
  // Queues cached blocks freed to the tail by `rank` (not owned; must outlive the pool; nullptr:
  // by time). Only before the pool caches anything (FailedPrecondition otherwise): the free list
  // must be in one order throughout.
  Status set_eviction_rank(const EvictionRank* rank);
  // Shared prefixes kept longer (off until set; ignored with an eviction rank). A caller counts,
  // per cached block, the distinct blocks published right after it (AddContinuation) and marks
  // every block of a prefix that several continuations share with their number (MarkShared). A
  // cached block of share level L >= 2 that is freed to the tail is queued as if it had been
  // freed ticks_per_level * min(L - 1, max_levels) ticks later: blocks freed meanwhile without a
  // level go ahead of it, so a prefix many requests branched from outlives the single-use tails
  // freed after it. Levels and counts belong to the identity: they start at 0 when a block is
  // published and are dropped with it. The free list stays sorted by tick, and an empty segment's
  // tick is the time it emptied or, while later, the highest tick it queues. Only before the pool
  // caches anything and never with an eviction rank (FailedPrecondition otherwise, either order);
  // max_levels in [1, 254]. ResetPrefixCache queues every free block as worth nothing.
  Status set_branch_bonus(uint64_t ticks_per_level, int32_t max_levels);
  uint64_t branch_bonus_ticks() const { return bonus_ticks_; }
  // A block was published right after `block` (a cached block), `child` naming its content:
  // the count of distinct continuations, which saturates at 255. The first child's name is kept,
  // so the same child published again (evicted, then computed anew) does not count twice; later
  // ones are not told apart. Errors: bad id, a block without identity.
  Result<int32_t> AddContinuation(int32_t block, uint32_t child);
  // Raises a cached block's share level to at least `level` (saturating at 255); a block queued
  // already keeps its place until it is freed again. Errors: bad id, a block without identity.
  Status MarkShared(int32_t block, int32_t level);
  int32_t continuations(int32_t block) const { return continuations_[static_cast<size_t>(block)]; }
  int32_t share_level(int32_t block) const { return share_[static_cast<size_t>(block)]; }
  // The rank of a block's prefix changed: a free cached block queued at the tail is requeued by
  // its new rank (held, worthless and uncached blocks have nothing to requeue). Errors (nothing
  // changed): bad id, no eviction rank set.
  Status Rerank(int32_t block);

  // The block holding `key`, held or free, or -1.
  int32_t Find(const PrefixKey& key) const { return index_.Find(key); }
  // A hint that Find(key) comes soon (PrefixIndex::Prefetch).
  void PrefetchFind(const PrefixKey& key) const { index_.Prefetch(key); }
  // One more reference to a held block, or takes a free block that still has its identity (a
  // prefix hit) off the free list.
  Status Acquire(int32_t block);
  // Acquire, also of a free block without identity: for a caller taking back blocks it has just
  // freed, before anything was allocated (their contents are intact; the rest of the free list
  // is as before the release).
  Status Reacquire(int32_t block);
  // Gives a held block its prefix identity. If another block already has the key: while that
  // block is held, the index is left as it is and the caller's copy stays private; once it is
  // free, the key moves to the caller's copy with its share level and continuations (a `removed`
  // event for the old block, a `stored` one for this), and the old block, worth nothing now,
  // joins the free blocks that cache nothing. The older copy would otherwise be evicted before
  // the newer one is freed, and the newer one would go back private: the prefix would lose the
  // block while a copy of it existed.
  // `take_over`: false keeps the key where it is even on a free block (the caller's copy is not
  // written yet, and may be withdrawn before it is).
  // `holder`: the block that had the key before the call (-1: none).
  Status Publish(int32_t block, const PrefixKey& key, const PublishOrigin& from = {},
                 bool take_over = true, int32_t* holder = nullptr);
  Status Publish(int32_t block, const PrefixKey& key, uint64_t origin, int64_t position = -1) {
    return Publish(block, key, PublishOrigin{origin, position, std::nullopt, 0});
  }
  // Withdraws a held block's prefix identity (a `removed` event; nothing when it has none): what it
  // was published for will not be computed after all. Errors (nothing changed): bad id, a free or
  // dormant block.
  Status Unpublish(int32_t block);
  // Drops one reference per listed block (a block may be listed as often as it is referenced).
  // Blocks that become free are queued for eviction in the order listed, at the tail or, with
  // Retention::kLow, at the head of the free list. With Retention::kProbation, cached blocks
  // become free as if freed to the tail and demoted at once (Demote), in the order listed, so
  // blocks freed together leave in the order they would have at the tail; blocks without
  // identity go to the head, and blocks a branch bonus keeps (share level >= 2) to the tail.
  // Each cached block put on probation advances the eviction clock as a free to the tail does.
  Status Free(std::span<const int32_t> blocks, Retention retention = Retention::kNormal);
  // Moves a free block ahead of every block freed to the tail, behind those freed to the head
  // (blocks worth nothing are still reused first), keeping its prefix identity: it still serves
  // hits, but is evicted before every block of normal retention. A segment left with no held block
  // whose cached blocks all sit at the head moves to the front of its empty-segment list, so the
  // arena also gives it to another class before older memory. Errors (nothing changed): bad id, a
  // held or dormant block.
  Status Demote(int32_t block);
  // Drops every prefix identity (held and free blocks alike) and emits one `cleared` event.
  void ResetPrefixCache();
  // Compaction: free block `dst` takes held block `src`'s reference count and prefix identity
  // (events `removed` src, then `stored` dst, so a consumer following blocks sees the key move);
  // an identity dst still cached is dropped first (`removed`). src becomes free and uncached, at
  // the head of the free list. Fails, changing nothing, unless both are real blocks of owned
  // segments, src is held, dst is free and they differ.
  Status MoveHeld(int32_t src, int32_t dst);
  // Compaction: free block `dst` takes free cached block `src`'s prefix identity and its place in
  // the free list (same tick, share level and continuations), so what it caches is evicted exactly
  // when it would have been; events and the dropped-key log as MoveHeld. src becomes free and
  // uncached, at the head of the free list. Fails, changing nothing, unless both are real blocks,
  // src is free with an identity, dst is free, they differ and each one's segment holds a block
  // (segments in use keep their place in the segment lists whatever they cache).
  Status MoveCached(int32_t src, int32_t dst);

  // Segments. AddSegment makes an unowned segment's blocks free and uncached, at the head of the
  // free list (the next Allocate takes them before anything cached). RemoveSegment gives up an
  // owned segment none of whose blocks is held; the identities its free blocks had are dropped
  // (`removed` events).
  Status AddSegment(int32_t segment);
  Status RemoveSegment(int32_t segment);
  int32_t num_segments() const { return static_cast<int32_t>(seg_held_.size()); }
  int32_t segment_blocks() const { return segment_blocks_; }
  // A pool of one segment (every fixed pool) skips the division on its per-block path.
  int32_t segment_of(int32_t block) const {
    return seg_held_.size() == 1 ? 0 : (block - 1) / segment_blocks_;
  }
  bool segment_owned(int32_t segment) const { return seg_list_[Seg(segment)] != kUnowned; }
  int32_t segment_held(int32_t segment) const { return seg_held_[Seg(segment)]; }
  int32_t segment_cached(int32_t segment) const { return seg_cached_[Seg(segment)]; }
  // The owned segment with no held block that became so first, among those without (or with)
  // cached blocks; -1 when there is none. empty_since() is its tick.
  int32_t OldestEmptyUncached() const { return empty_head_[kEmptyUncached]; }
  int32_t OldestEmptyCached() const { return empty_head_[kEmptyCached]; }
  uint64_t empty_since(int32_t segment) const { return seg_tick_[Seg(segment)]; }
  // The next segment on the same empty-segment list, in age order; -1 at its end.
  int32_t NextEmptySegment(int32_t segment) const { return seg_next_[Seg(segment)]; }
  int32_t num_empty_segments() const { return num_empty_; }
  // Free blocks in owned segments that still hold a block, cached or not: what emptying such a
  // segment (compaction) could give back. O(1).
  int32_t free_in_held_segments() const { return num_free_ - num_empty_ * segment_blocks_; }
  // Those of them that cache nothing: stranded, no other class can use them. O(empty segments
  // that still cache), not a walk of the free list.
  int32_t StrandedBlocks() const;
  // Owned blocks (free or held), free blocks with a prefix identity.
  int32_t num_owned() const { return num_owned_; }
  int32_t num_free_cached() const { return num_free_cached_; }
  // Those of them queued at the tail (not freed to the head, demoted or on probation): the part of
  // the cache that recency alone orders. O(1).
  int32_t num_queued_cached() const { return num_queued_cached_; }
  // The eviction clock: one tick per cached block freed to the tail or on probation.
  uint64_t clock() const { return *clock_; }
  // The tick a free block was queued with (0 for blocks queued at the head).
  uint64_t free_tick(int32_t block) const { return tick_[static_cast<size_t>(block)]; }
  // The free block after `block` in eviction order (-1 at the end); -1 starts from the head.
  int32_t NextFree(int32_t block) const {
    return block < 0 ? head_ : next_[static_cast<size_t>(block)];
  }

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return num_free_; }  // free owned blocks, cached or not
  // Counts the times a prefix identity left a block (evicted, moved, the cache reset). While it
  // stands still, every key Find answered still names the same block, so a caller may keep the
  // answers instead of asking again. Publishing moves it only when a key is taken over (Publish).
  uint64_t identity_epoch() const { return identity_epoch_; }
  int32_t num_cached() const { return index_.size(); }
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }
  bool has_identity(int32_t block) const { return has_key_[static_cast<size_t>(block)] != 0; }
  // The block's prefix key; meaningful only while has_identity(block).
  const PrefixKey& identity(int32_t block) const { return key_[static_cast<size_t>(block)]; }
  // Blocks in eviction order (the next Allocate takes them from the front).
  std::vector<int32_t> FreeListOrder() const;
  std::vector<KvEvent> TakeEvents();
  // With tracking on (off by default), every identity the pool drops one at a time - a cached
  // block reused, a segment given up, a key moved by MoveHeld (the new holder has it again) -
  // is also logged for the owner (a key Publish takes over is not: it never leaves the pool), which
  // drains the log after each call that may evict: TakeDropped hands it over in `out` (whose old
  // contents it discards) and starts a new one. ResetPrefixCache logs nothing: it drops everything
  // at once.
  void TrackDropped(bool on) { track_dropped_ = on; }
  void TakeDropped(std::vector<PrefixKey>& out) {
    out.swap(dropped_);
    dropped_.clear();
  }

  // Checks every invariant of the contract; the second form also compares reference counts with
  // the holders the caller knows of (entry 0 is ignored). Names the first violation.
  Status CheckInvariants() const;
  Status CheckInvariants(std::span<const int32_t> expected_ref_counts) const;

 private:
  // Segment list ids: where an owned segment with no held block is kept.
  static constexpr uint8_t kEmptyUncached = 0, kEmptyCached = 1, kPartlyHeld = 2, kUnowned = 3;

  BlockPool(int32_t num_segments, int32_t segment_blocks, bool owned,
            std::shared_ptr<uint64_t> clock, bool record_events);
  static size_t Seg(int32_t segment) { return static_cast<size_t>(segment); }
  // Every call naming a block checks it; the check is inline and the error built apart, so a
  // valid id costs two comparisons.
  bool ValidBlock(int32_t block) const { return block > kNullBlock && block < num_blocks(); }
  Status BadBlock(int32_t block, const char* call) const;
  Status CheckSegmentId(int32_t segment, const char* call) const;
  void Unlink(int32_t block);
  void Append(int32_t block);
  void Prepend(int32_t block);
  void InsertAfterHeadRun(int32_t block);  // tick 0, after the blocks queued at the head
  // After a free block moved towards the head: its segment's place among the empty ones.
  void Requeued(int32_t block);
  // `dropped`: whether the key leaves the pool (TrackDropped); false when it moves to another
  // block in the same breath.
  void DropIdentity(int32_t block, bool dropped = true);
  // `from`'s key, share level, continuations and first child go to `to`, which has no identity
  // (`removed` from, then `stored` to); `dropped` as DropIdentity's. Lists are the caller's.
  void HandIdentity(int32_t from, int32_t to, const PublishOrigin& origin = {},
                    bool dropped = true);
  void Record(KvEvent::Kind kind, const PrefixKey& key, int32_t block,
              const PublishOrigin& from = {});
  // Reference transitions 0 -> 1 and 1 -> 0, and identity changes, as seen by the segments.
  void Held(int32_t block);
  void Released(int32_t block);
  void SegmentCached(int32_t block, int delta);
  // Onto the tail of `list` (or off all lists); `front`: onto its head instead.
  void MoveSegment(int32_t segment, uint8_t list, bool front = false);
  // Whether no cached free block of the segment is queued at the tail (all it caches was freed
  // to the head or demoted): once empty, it is worth no more than plain free memory and its
  // slab sorts first. Released and Demote both follow this rule.
  bool NothingCachedQueued(int32_t segment) const { return seg_cached_queued_[Seg(segment)] == 0; }
  // Links a free block after `after` (-1: at the head) with eviction tick `tick` (0: queued at
  // the head); Append, Prepend and InsertAfterHeadRun are its three uses.
  void Link(int32_t block, int32_t after, uint64_t tick);
  // Ranked queuing: the block's rank (>= 1), its place in the sorted free list (walked from both
  // ends at once: a freed block's rank is mostly near one end), and an empty segment's tick (the
  // highest rank it caches; 0 when it caches nothing queued at the tail).
  uint64_t RankOf(int32_t block) const;
  void LinkByRank(int32_t block, uint64_t tick);
  uint64_t MaxQueuedTick(int32_t segment) const;
  // An empty cached segment whose blocks were requeued or demoted: its tick again, and its place.
  void RetickEmptySegment(int32_t segment);
  // Gives a block a prefix identity (stored event), probing the index once; when another block
  // holds the identity already, changes nothing.
  // false: another block holds key
  // `holder`: the block that already had the key (-1 when it was stored).
  bool Store(int32_t block, const PrefixKey& key, const PublishOrigin& from = {},
             int32_t* holder = nullptr);
  // CheckInvariants' parts, in the order it checks; CountBlocks tallies the blocks per segment
  // and in all for the checks after it.
  struct InvariantCounts {
    int32_t marked = 0, identities = 0, free_cached = 0;
    std::vector<int32_t> held, cached, queued;  // per segment
  };
  Status CheckFreeList() const;
  Status CountBlocks(InvariantCounts& counts) const;
  Status CheckSegments(const InvariantCounts& counts, int32_t& empty) const;
  Status CheckEmptySegmentLists(int32_t empty) const;
  Status CheckIndex(int32_t identities) const;
  // A block no hit can use: no identity, or queued at the head (demoted, released low).
  bool Worthless(int32_t b) const {
    const auto i = static_cast<size_t>(b);
    return tick_[i] == 0 || !has_key_[i];
  }
  // Allocate's look-ahead: start loading a free block's key, and the index slot its key hashes
  // to (returning the block after it on the free list).
  void PrefetchKeyOf(int32_t b) const { PrefetchLine(key_[static_cast<size_t>(b)]); }
  int32_t PrefetchSlotOf(int32_t b) const {
    const auto i = static_cast<size_t>(b);
    if (has_key_[i]) index_.Prefetch(key_[i]);
    return next_[i];
  }
  // Packing: a free block worth nothing in the segment being filled, else the head (whose
  // segment is filled next). Only while the head is worth nothing.
  int32_t NextPacked();

  std::vector<int32_t> ref_;
  std::vector<int32_t> prev_, next_;  // free-list links, -1 at the ends
  std::vector<uint8_t> on_list_;
  std::vector<PrefixKey> key_;
  std::vector<uint8_t> has_key_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0;
  uint64_t identity_epoch_ = 0;
  // Blocks queued at the head (tick 0) always precede those queued at the tail; this is the last
  // of them (-1: none), after which Demote queues.
  int32_t head_run_end_ = -1;
  PrefixIndex index_;
  bool record_events_ = true;
  std::vector<KvEvent> events_;
  bool track_dropped_ = false;
  std::vector<PrefixKey> dropped_;
  std::vector<int32_t> pending_;  // Free's validation: times listed per block, kept all zero
  std::vector<int32_t> scratch_;  // Free with kProbation: blocks queued after the head run
  std::vector<uint64_t> tick_;    // per free block: eviction clock when queued
  std::shared_ptr<uint64_t> clock_;
  int32_t num_owned_ = 0, num_free_cached_ = 0;
  int32_t num_queued_cached_ = 0;  // the sum of seg_cached_queued_
  // Segments.
  int32_t segment_blocks_ = 1;
  std::vector<int32_t> seg_held_, seg_cached_;
  std::vector<int32_t> seg_cached_queued_;  // cached free blocks queued at the tail (tick != 0)
  std::vector<uint8_t> seg_list_;
  std::vector<int32_t> seg_prev_, seg_next_;
  std::vector<uint64_t> seg_tick_;
  int32_t empty_head_[2] = {-1, -1}, empty_tail_[2] = {-1, -1};
  int32_t num_empty_ = 0;
  // Cached blocks in the segments on the cached empty list, kept as they move, so that
  // StrandedBlocks (read every step to decide on compaction) need not walk that list.
  int32_t cached_in_empty_ = 0;
  const EvictionRank* rank_ = nullptr;
  // Shared prefixes (set_branch_bonus): per block, continuations published after it and its share
  // level; bonus_ticks_ 0: off. plain_end_ is where a block freed now without a bonus goes: the
  // last listed block of tick <= the clock (-1: right after the head run); blocks behind it carry
  // a bonus not yet reached.
  std::vector<uint8_t> continuations_, share_;
  std::vector<uint32_t> first_child_;
  uint64_t bonus_ticks_ = 0;
  int32_t bonus_levels_ = 0;
  int32_t plain_end_ = -1;
  // Ranked order: the free list and the cached empty segments are sorted by a tick that is not
  // the time of queueing (an eviction rank, or a share bonus).
  bool ranked() const { return rank_ != nullptr || bonus_ticks_ != 0; }
  uint64_t BonusOf(int32_t b) const;
  uint64_t EmptyTick(int32_t seg) const;  // a segment's tick when its last held block is freed
  int32_t PlainEnd(uint64_t now);
  bool pack_ = false;
  int32_t fill_ = -1;          // the segment being filled, -1 none
  int32_t fill_next_ = 0;      // next block of fill_ to look at
  bool fill_wrapped_ = false;  // fill_next_ went back to the segment's start once
};

}  // namespace hkv
