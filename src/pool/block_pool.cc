#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include <hkv/pool/block_pool.h>

namespace hkv {

Result<BlockPool> BlockPool::Create(int32_t num_blocks, bool record_events) {
  if (num_blocks < 2) {
    return Status::InvalidArgument(fmt::format(
        "block pool of {} blocks: expected at least 2 (block 0 is the null block)", num_blocks));
  }
  return BlockPool(1, num_blocks - 1, true, std::make_shared<uint64_t>(0), record_events);
}

Result<BlockPool> BlockPool::CreateSegmented(int32_t num_segments, int32_t segment_blocks,
                                             std::shared_ptr<uint64_t> clock, bool record_events) {
  if (num_segments < 1) {
    return Status::InvalidArgument(
        fmt::format("segmented block pool: {} segments: expected >= 1", num_segments));
  }
  if (segment_blocks < 1) {
    return Status::InvalidArgument(
        fmt::format("segmented block pool: {} blocks per segment: expected >= 1", segment_blocks));
  }
  if (int64_t{num_segments} * segment_blocks + 1 > INT32_MAX) {
    return Status::InvalidArgument(fmt::format(
        "segmented block pool of {} segments of {} blocks: {} blocks; expected at most 2^31 - 2",
        num_segments, segment_blocks, int64_t{num_segments} * segment_blocks));
  }
  if (clock == nullptr) return Status::InvalidArgument("segmented block pool: no eviction clock");
  return BlockPool(num_segments, segment_blocks, false, std::move(clock), record_events);
}

BlockPool::BlockPool(int32_t num_segments, int32_t segment_blocks, bool owned,
                     std::shared_ptr<uint64_t> clock, bool record_events)
    : ref_(static_cast<size_t>(num_segments) * static_cast<size_t>(segment_blocks) + 1, 0),
      prev_(ref_.size(), -1),
      next_(ref_.size(), -1),
      on_list_(ref_.size(), 0),
      key_(ref_.size()),
      has_key_(ref_.size(), 0),
      // A segmented pool starts with no pages; AddSegment grows the table as it gains them.
      index_(owned ? static_cast<int32_t>(ref_.size()) : 0),
      record_events_(record_events),
      pending_(ref_.size(), 0),
      tick_(ref_.size(), 0),
      clock_(std::move(clock)),
      segment_blocks_(segment_blocks),
      seg_held_(static_cast<size_t>(num_segments), 0),
      seg_cached_(static_cast<size_t>(num_segments), 0),
      seg_cached_queued_(static_cast<size_t>(num_segments), 0),
      seg_list_(static_cast<size_t>(num_segments), kUnowned),
      seg_prev_(static_cast<size_t>(num_segments), -1),
      seg_next_(static_cast<size_t>(num_segments), -1),
      seg_tick_(static_cast<size_t>(num_segments), 0),
      continuations_(ref_.size(), 0),
      share_(ref_.size(), 0),
      first_child_(ref_.size(), 0) {
  if (!owned) return;
  // A pool that owns its blocks from the start queues them in id order.
  for (int32_t s = 0; s < num_segments; ++s) {
    MoveSegment(s, kEmptyUncached);
    num_owned_ += segment_blocks_;
  }
  // At the head (reversed, so in id order): fresh memory is worth nothing cached, and demoted
  // blocks queue behind it.
  for (int32_t b = num_blocks() - 1; b >= 1; --b)
    Prepend(b);
}

Status BlockPool::CheckSegmentId(int32_t segment, const char* call) const {
  if (segment < 0 || segment >= num_segments()) {
    return Status::InvalidArgument(fmt::format("{}: segment {} is out of range: expected 0 to {}",
                                               call, segment, num_segments() - 1));
  }
  return Status::Ok();
}

void BlockPool::MoveSegment(int32_t seg, uint8_t list, bool front) {
  const size_t i = Seg(seg);
  const uint8_t from = seg_list_[i];
  if (from == kEmptyCached) cached_in_empty_ -= seg_cached_[i];
  if (list == kEmptyCached) cached_in_empty_ += seg_cached_[i];
  if (from == kEmptyUncached || from == kEmptyCached) {
    if (seg_prev_[i] >= 0)
      seg_next_[Seg(seg_prev_[i])] = seg_next_[i];
    else
      empty_head_[from] = seg_next_[i];
    if (seg_next_[i] >= 0)
      seg_prev_[Seg(seg_next_[i])] = seg_prev_[i];
    else
      empty_tail_[from] = seg_prev_[i];
    seg_prev_[i] = seg_next_[i] = -1;
    --num_empty_;
  }
  seg_list_[i] = list;
  if ((list == kEmptyUncached || list == kEmptyCached) && front) {
    seg_next_[i] = empty_head_[list];
    if (empty_head_[list] >= 0)
      seg_prev_[Seg(empty_head_[list])] = seg;
    else
      empty_tail_[list] = seg;
    empty_head_[list] = seg;
    ++num_empty_;
  } else if (list == kEmptyCached && ranked()) {
    // Ranked: the list stays sorted by tick (the highest rank each segment caches).
    int32_t after = empty_tail_[list];
    while (after >= 0 && seg_tick_[Seg(after)] > seg_tick_[i])
      after = seg_prev_[Seg(after)];
    seg_prev_[i] = after;
    seg_next_[i] = after < 0 ? empty_head_[list] : seg_next_[Seg(after)];
    if (seg_next_[i] >= 0)
      seg_prev_[Seg(seg_next_[i])] = seg;
    else
      empty_tail_[list] = seg;
    if (after >= 0)
      seg_next_[Seg(after)] = seg;
    else
      empty_head_[list] = seg;
    ++num_empty_;
  } else if (list == kEmptyUncached || list == kEmptyCached) {
    seg_prev_[i] = empty_tail_[list];
    if (empty_tail_[list] >= 0)
      seg_next_[Seg(empty_tail_[list])] = seg;
    else
      empty_head_[list] = seg;
    empty_tail_[list] = seg;
    ++num_empty_;
  }
}

void BlockPool::Held(int32_t b) {
  const int32_t seg = segment_of(b);
  if (seg_held_[Seg(seg)]++ == 0) MoveSegment(seg, kPartlyHeld);
}

void BlockPool::Released(int32_t b) {
  const int32_t seg = segment_of(b);
  const size_t i = Seg(seg);
  if (--seg_held_[i] == 0) {
    const bool at_head = NothingCachedQueued(seg);
    seg_tick_[i] = at_head ? 0 : EmptyTick(seg);
    MoveSegment(seg, seg_cached_[i] > 0 ? kEmptyCached : kEmptyUncached, at_head);
  }
}

void BlockPool::SegmentCached(int32_t b, int delta) {
  const int32_t seg = segment_of(b);
  const size_t i = Seg(seg);
  seg_cached_[i] += delta;
  if (seg_list_[i] == kEmptyCached) cached_in_empty_ += delta;
  // An empty segment that loses its last identity is plain free memory from now on.
  if (seg_cached_[i] == 0 && seg_list_[i] == kEmptyCached) MoveSegment(seg, kEmptyUncached);
}

Status BlockPool::BadBlock(int32_t block, const char* call) const {
  return Status::InvalidArgument(
      fmt::format("{}: block {} is {}: expected 1 to {}", call, block,
                  block == kNullBlock ? "the null block" : "out of range", num_blocks() - 1));
}

void BlockPool::Unlink(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  if (prev_[i] >= 0)
    next_[static_cast<size_t>(prev_[i])] = next_[i];
  else
    head_ = next_[i];
  if (next_[i] >= 0)
    prev_[static_cast<size_t>(next_[i])] = prev_[i];
  else
    tail_ = prev_[i];
  if (head_run_end_ == b) head_run_end_ = prev_[i];
  if (plain_end_ == b) {
    const int32_t p = prev_[i];
    plain_end_ = p >= 0 && tick_[static_cast<size_t>(p)] != 0 ? p : -1;
  }
  prev_[i] = next_[i] = -1;
  on_list_[i] = 0;
  --num_free_;
  num_free_cached_ -= has_key_[i];
  if (tick_[i] != 0 && has_key_[i]) {
    --seg_cached_queued_[Seg(segment_of(b))];
    --num_queued_cached_;
  }
}

void BlockPool::Link(int32_t b, int32_t after, uint64_t tick) {
  const size_t i = static_cast<size_t>(b);
  prev_[i] = after;
  next_[i] = after < 0 ? head_ : next_[static_cast<size_t>(after)];
  if (next_[i] >= 0)
    prev_[static_cast<size_t>(next_[i])] = b;
  else
    tail_ = b;
  if (after >= 0)
    next_[static_cast<size_t>(after)] = b;
  else
    head_ = b;
  if (tick == 0 && after == head_run_end_) head_run_end_ = b;
  on_list_[i] = 1;
  ++num_free_;
  num_free_cached_ += has_key_[i];
  tick_[i] = tick;
  if (tick != 0 && has_key_[i]) {
    ++seg_cached_queued_[Seg(segment_of(b))];
    ++num_queued_cached_;
  }
}

void BlockPool::Append(int32_t b) {
  if (rank_ != nullptr) {
    LinkByRank(b, RankOf(b));
    return;
  }
  const uint64_t now = ++*clock_;
  if (bonus_ticks_ == 0) {
    Link(b, tail_, now);
    return;
  }
  const uint64_t bonus = BonusOf(b);
  if (bonus > 0) {
    // Mostly at the tail: a shared block freed now outranks everything freed before it.
    LinkByRank(b, now + bonus);
    return;
  }
  Link(b, PlainEnd(now), now);
  plain_end_ = b;
}

uint64_t BlockPool::BonusOf(int32_t b) const {
  const size_t i = static_cast<size_t>(b);
  if (!has_key_[i] || share_[i] < 2) return 0;
  return bonus_ticks_ * static_cast<uint64_t>(std::min<int32_t>(share_[i] - 1, bonus_levels_));
}

int32_t BlockPool::PlainEnd(uint64_t now) {
  // Bonuses the clock has reached since the last call join the plain part: each is passed once.
  int32_t after = plain_end_ >= 0 ? plain_end_ : head_run_end_;
  for (int32_t n = after < 0 ? head_ : next_[static_cast<size_t>(after)];
       n >= 0 && tick_[static_cast<size_t>(n)] <= now; n = next_[static_cast<size_t>(n)])
    after = n;
  return after;
}

Status BlockPool::set_branch_bonus(uint64_t ticks_per_level, int32_t max_levels) {
  if (rank_ != nullptr) {
    return Status::FailedPrecondition(
        "set branch bonus: the pool queues by an eviction rank, which orders every cached block");
  }
  if (num_cached() > 0) {
    return Status::FailedPrecondition(fmt::format(
        "set branch bonus: the pool already caches {} block(s) queued without it", num_cached()));
  }
  if (max_levels < 1 || max_levels > 254) {
    return Status::InvalidArgument(
        fmt::format("set branch bonus: max_levels {} must be in [1, 254]", max_levels));
  }
  bonus_ticks_ = ticks_per_level;
  bonus_levels_ = max_levels;
  plain_end_ = -1;  // PlainEnd walks forward from the head run on the next plain free
  return Status::Ok();
}

Result<int32_t> BlockPool::AddContinuation(int32_t block, uint32_t child) {
  if (!ValidBlock(block)) return BadBlock(block, "add continuation");
  const size_t i = static_cast<size_t>(block);
  if (!has_key_[i]) {
    return Status::FailedPrecondition(
        fmt::format("add continuation: block {} has no prefix identity", block));
  }
  if (continuations_[i] == 0) {
    first_child_[i] = child;
    continuations_[i] = 1;
  } else if (continuations_[i] < 255 && (continuations_[i] > 1 || first_child_[i] != child)) {
    ++continuations_[i];
  }
  return static_cast<int32_t>(continuations_[i]);
}

Status BlockPool::MarkShared(int32_t block, int32_t level) {
  if (!ValidBlock(block)) return BadBlock(block, "mark shared");
  const size_t i = static_cast<size_t>(block);
  if (!has_key_[i]) {
    return Status::FailedPrecondition(
        fmt::format("mark shared: block {} has no prefix identity", block));
  }
  share_[i] = static_cast<uint8_t>(std::clamp<int32_t>(level, share_[i], 255));
  return Status::Ok();
}

uint64_t BlockPool::RankOf(int32_t b) const {
  const size_t i = static_cast<size_t>(b);
  if (!has_key_[i]) return 1;
  return std::clamp<uint64_t>(rank_->Rank(key_[i].hash), 1, uint64_t{1} << 63);
}

void BlockPool::LinkByRank(int32_t b, uint64_t tick) {
  // The first ranked block and the last: the walk meets the spot from whichever side is nearer.
  int32_t front_after = head_run_end_;
  int32_t front = head_run_end_ < 0 ? head_ : next_[static_cast<size_t>(head_run_end_)];
  int32_t back = tail_;
  for (;;) {
    if (back == head_run_end_ || tick_[static_cast<size_t>(back)] <= tick) {
      Link(b, back, tick);
      return;
    }
    if (front < 0 || tick_[static_cast<size_t>(front)] > tick) {
      Link(b, front_after, tick);
      return;
    }
    back = prev_[static_cast<size_t>(back)];
    front_after = front;
    front = next_[static_cast<size_t>(front)];
  }
}

uint64_t BlockPool::MaxQueuedTick(int32_t seg) const {
  uint64_t most = 0;
  const int32_t first = seg * segment_blocks_ + 1;
  for (int32_t b = first; b < first + segment_blocks_; ++b) {
    const size_t i = static_cast<size_t>(b);
    if (on_list_[i] && has_key_[i]) most = std::max(most, tick_[i]);
  }
  return most;
}

uint64_t BlockPool::EmptyTick(int32_t seg) const {
  // With a rank, what the segment caches is worth its best block. Otherwise it is as old as the
  // time it emptied, or younger while a shared block in it is still within its bonus.
  if (rank_ != nullptr) return MaxQueuedTick(seg);
  if (bonus_ticks_ != 0) return std::max(*clock_, MaxQueuedTick(seg));
  return *clock_;
}

void BlockPool::RetickEmptySegment(int32_t seg) {
  const size_t s = Seg(seg);
  if (seg_held_[s] != 0 || seg_list_[s] != kEmptyCached) return;
  const bool at_head = NothingCachedQueued(seg);
  seg_tick_[s] = at_head ? 0 : MaxQueuedTick(seg);
  MoveSegment(seg, kEmptyCached, at_head);
}

Status BlockPool::set_eviction_rank(const EvictionRank* rank) {
  if (rank != nullptr && bonus_ticks_ != 0) {
    return Status::FailedPrecondition(
        "set eviction rank: the pool keeps shared prefixes longer (set_branch_bonus)");
  }
  if (num_cached() > 0) {
    return Status::FailedPrecondition(fmt::format(
        "set eviction rank: the pool already caches {} block(s) queued by another order",
        num_cached()));
  }
  rank_ = rank;
  return Status::Ok();
}

Status BlockPool::Rerank(int32_t block) {
  if (!ValidBlock(block)) return BadBlock(block, "rerank");
  if (rank_ == nullptr) return Status::FailedPrecondition("rerank: the pool has no eviction rank");
  const size_t i = static_cast<size_t>(block);
  if (!on_list_[i] || tick_[i] == 0 || !has_key_[i]) return Status::Ok();
  const uint64_t tick = RankOf(block);
  if (tick == tick_[i]) return Status::Ok();
  Unlink(block);
  LinkByRank(block, tick);
  RetickEmptySegment(segment_of(block));
  return Status::Ok();
}

void BlockPool::Prepend(int32_t b) {
  Link(b, -1, 0);
}

void BlockPool::InsertAfterHeadRun(int32_t b) {
  Link(b, head_run_end_, 0);
}

void BlockPool::Record(KvEvent::Kind kind, const PrefixKey& key, int32_t block,
                       const PublishOrigin& from) {
  if (record_events_) events_.push_back({kind, key, block, from});
}

void BlockPool::DropIdentity(int32_t b, bool dropped) {
  const size_t i = static_cast<size_t>(b);
  if (!has_key_[i]) return;
  ++identity_epoch_;
  index_.Erase(key_[i]);
  has_key_[i] = 0;
  continuations_[i] = share_[i] = 0;
  num_free_cached_ -= on_list_[i];
  if (on_list_[i] && tick_[i] != 0) {
    --seg_cached_queued_[Seg(segment_of(b))];
    --num_queued_cached_;
  }
  SegmentCached(b, -1);
  Record(KvEvent::Kind::kRemoved, key_[i], b);
  if (track_dropped_ && dropped) dropped_.push_back(key_[i]);
}

Status BlockPool::Allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0) return Status::InvalidArgument(fmt::format("allocate {} blocks: expected n >= 0", n));
  if (n > num_free_) {
    return Status::ResourceExhausted(fmt::format("allocate {} blocks: only {} free", n, num_free_));
  }
  // Reusing a cached block erases its key from the index: a probe of a table larger than the
  // caches, at a slot no earlier access warmed. The blocks come off the head in list order, so a
  // cursor a few blocks ahead starts those loads early (the key, then the slot it hashes to), and
  // the misses overlap instead of following one another.
  // Only blocks this call takes are looked at: a decode step's single block pays for nothing.
  constexpr int32_t kKeyAhead = 8, kSlotAhead = 4;
  int32_t key_cursor = head_, slot_cursor = head_, keys = 0, slots = 0;
  const auto advance = [&](int32_t key_until, int32_t slot_until) {
    for (; keys < key_until && key_cursor >= 0; ++keys) {
      PrefetchKeyOf(key_cursor);
      key_cursor = next_[static_cast<size_t>(key_cursor)];
    }
    for (; slots < slot_until && slot_cursor >= 0; ++slots)
      slot_cursor = PrefetchSlotOf(slot_cursor);
  };
  for (int32_t k = 0; k < n; ++k) {
    if (n > 1) advance(std::min(n, k + kKeyAhead), std::min(n, k + kSlotAhead));
    int32_t b = head_;
    // Blocks worth nothing are interchangeable: take one beside the blocks just allocated.
    if (pack_ && Worthless(b)) b = NextPacked();
    Unlink(b);
    DropIdentity(b);  // the lazy eviction happens here, when the block is reused
    ref_[static_cast<size_t>(b)] = 1;
    Held(b);
    out.push_back(b);
  }
  return Status::Ok();
}

int32_t BlockPool::NextPacked() {
  if (fill_ >= 0) {
    const int32_t first = fill_ * segment_blocks_ + 1;
    const int32_t end = first + segment_blocks_;
    for (int pass = 0; pass < 2; ++pass) {
      for (; fill_next_ < end; ++fill_next_) {
        if (on_list_[static_cast<size_t>(fill_next_)] && Worthless(fill_next_)) return fill_next_++;
      }
      // Blocks behind the cursor may have been freed since it passed them: look once more.
      if (fill_wrapped_) break;
      fill_wrapped_ = true;
      fill_next_ = first;
    }
  }
  // Fill the head's segment next: it holds the least valuable blocks, likely more than one.
  fill_ = segment_of(head_);
  fill_next_ = fill_ * segment_blocks_ + 1;
  fill_wrapped_ = true;  // the walk starts at the segment's beginning
  return head_;
}

Status BlockPool::Acquire(int32_t block) {
  if (!ValidBlock(block)) return BadBlock(block, "acquire");
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    if (!has_key_[i]) {
      return Status::FailedPrecondition(fmt::format(
          "acquire: block {} is free and has no prefix identity: allocate instead", block));
    }
    Unlink(block);
  }
  if (ref_[i]++ == 0) Held(block);
  return Status::Ok();
}

Status BlockPool::Reacquire(int32_t block) {
  if (!ValidBlock(block)) return BadBlock(block, "reacquire");
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    if (!on_list_[i]) {
      return Status::FailedPrecondition(
          fmt::format("reacquire: block {} is in a segment this pool does not own", block));
    }
    Unlink(block);
  }
  if (ref_[i]++ == 0) Held(block);
  return Status::Ok();
}

Status BlockPool::Publish(int32_t block, const PrefixKey& key, const PublishOrigin& from,
                          bool take_over, int32_t* holder) {
  if (!ValidBlock(block)) return BadBlock(block, "publish");
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    return Status::FailedPrecondition(fmt::format(
        "publish: block {} is free or dormant: only held blocks can be published", block));
  }
  if (has_key_[i]) {
    return Status::FailedPrecondition(
        fmt::format("publish: block {} already has a prefix identity", block));
  }
  // One probe when the key is new (nearly always): Store inserts it or names its holder.
  int32_t old = -1;
  if (Store(block, key, from, &old) || !take_over || !on_list_[static_cast<size_t>(old)]) {
    if (holder != nullptr) *holder = old;
    return Status::Ok();  // stored, or a held block with the key keeps it
  }
  if (holder != nullptr) *holder = old;
  HandIdentity(old, block, from, /*dropped=*/false);  // the key stays in the pool
  // Worth nothing now: to the head, where blocks released without identity go.
  Unlink(old);
  Prepend(old);
  Requeued(old);
  return Status::Ok();
}

void BlockPool::HandIdentity(int32_t from, int32_t to, const PublishOrigin& origin, bool dropped) {
  const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to);
  const PrefixKey key = key_[f];
  const uint8_t share = share_[f], continuations = continuations_[f];
  const uint32_t first_child = first_child_[f];
  // Removed before stored: a consumer keyed by prefix never sees the key on two blocks.
  DropIdentity(from, dropped);
  (void)Store(to, key, origin);  // the key was from's alone
  share_[t] = share;
  continuations_[t] = continuations;
  first_child_[t] = first_child;
}

Status BlockPool::Unpublish(int32_t block) {
  if (!ValidBlock(block)) return BadBlock(block, "unpublish");
  if (ref_[static_cast<size_t>(block)] == 0) {
    return Status::FailedPrecondition(fmt::format(
        "unpublish: block {} is free or dormant: only a held block's identity can be withdrawn "
        "(a free one leaves by eviction)",
        block));
  }
  DropIdentity(block);
  return Status::Ok();
}

bool BlockPool::Store(int32_t b, const PrefixKey& key, const PublishOrigin& from, int32_t* holder) {
  const size_t i = static_cast<size_t>(b);
  const int32_t found = index_.Emplace(key, b);
  if (holder != nullptr) *holder = found;
  if (found >= 0) return false;
  key_[i] = key;
  has_key_[i] = 1;
  SegmentCached(b, +1);
  Record(KvEvent::Kind::kStored, key, b, from);
  return true;
}

int32_t BlockPool::StrandedBlocks() const {
  // Uncached free blocks, less those in empty segments (all their blocks are free).
  return (num_free_ - num_free_cached_) - (num_empty_ * segment_blocks_ - cached_in_empty_);
}

Status BlockPool::Demote(int32_t block) {
  if (!ValidBlock(block)) return BadBlock(block, "demote");
  const size_t i = static_cast<size_t>(block);
  if (!on_list_[i]) {
    return Status::FailedPrecondition(
        fmt::format("demote: block {} is {}: only free blocks can be demoted", block,
                    ref_[i] > 0 ? "held" : "not owned by this pool"));
  }
  Unlink(block);
  InsertAfterHeadRun(block);
  Requeued(block);
  return Status::Ok();
}

void BlockPool::Requeued(int32_t block) {
  const int32_t seg = segment_of(block);
  const size_t s = Seg(seg);
  if (seg_held_[s] == 0 && NothingCachedQueued(seg)) {
    seg_tick_[s] = 0;
    MoveSegment(seg, seg_list_[s], true);
  } else if (rank_ != nullptr) {
    RetickEmptySegment(seg);  // its highest rank may have been this block's
  }
}

Status BlockPool::Free(std::span<const int32_t> blocks, Retention retention) {
  // Validate everything first: a rejected call must leave every count as it was. `pending_`
  // counts how often each block is listed (linear, no sort); it is zeroed again before return.
  Status bad;
  size_t counted = 0;
  for (; counted < blocks.size(); ++counted) {
    const int32_t b = blocks[counted];
    if (!ValidBlock(b)) {
      bad = BadBlock(b, "free");
      break;
    }
    const size_t i = static_cast<size_t>(b);
    if (++pending_[i] > ref_[i]) {
      bad = Status::FailedPrecondition(
          fmt::format("free: block {} listed {} time(s) but holds {} reference(s) (double free?)",
                      b, pending_[i], ref_[i]));
      ++counted;
      break;
    }
  }
  for (size_t k = 0; k < counted; ++k)
    pending_[static_cast<size_t>(blocks[k])] = 0;
  if (!bad.ok()) return bad;
  if (retention == Retention::kProbation) {
    // Demoted blocks join the end of the head run, so inserting in the listed order keeps it;
    // blocks without identity are prepended in reverse for the same reason (kLow). Blocks a
    // bonus keeps go to the tail, as listed.
    scratch_.clear();
    for (int32_t b : blocks) {
      if (--ref_[static_cast<size_t>(b)] != 0) continue;
      if (BonusOf(b) > 0) {
        Append(b);
        Released(b);
      } else {
        scratch_.push_back(b);
      }
    }
    for (int32_t b : scratch_) {
      if (!has_key_[static_cast<size_t>(b)]) continue;
      // The clock counts every cached block freed, kept or not: ages measured on it (the thrash
      // guard's) must not slow down when fewer blocks are kept.
      ++*clock_;
      InsertAfterHeadRun(b);
    }
    for (auto it = scratch_.rbegin(); it != scratch_.rend(); ++it) {
      if (!has_key_[static_cast<size_t>(*it)]) Prepend(*it);
    }
    for (int32_t b : scratch_)
      Released(b);
  } else if (retention == Retention::kNormal) {
    for (int32_t b : blocks) {
      if (--ref_[static_cast<size_t>(b)] == 0) {
        Append(b);
        Released(b);
      }
    }
  } else {
    // Prepending in reverse keeps the listed order at the head.
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (--ref_[static_cast<size_t>(*it)] == 0) {
        Prepend(*it);
        Released(*it);
      }
    }
  }
  return Status::Ok();
}

Status BlockPool::MoveHeld(int32_t src, int32_t dst) {
  if (!ValidBlock(src)) return BadBlock(src, "move held");
  if (!ValidBlock(dst)) return BadBlock(dst, "move held");
  const size_t s = static_cast<size_t>(src), d = static_cast<size_t>(dst);
  if (src == dst) {
    return Status::InvalidArgument(
        fmt::format("move held: block {} is both source and destination", src));
  }
  if (ref_[s] == 0) {
    return Status::FailedPrecondition(fmt::format(
        "move held: source block {} is {}: only held blocks move", src,
        segment_owned(segment_of(src)) ? "free" : "in a segment this pool does not own"));
  }
  if (!segment_owned(segment_of(dst))) {
    return Status::FailedPrecondition(fmt::format(
        "move held: destination block {} is in segment {}, which this pool does not own", dst,
        segment_of(dst)));
  }
  if (ref_[d] != 0) {
    return Status::FailedPrecondition(fmt::format(
        "move held: destination block {} is held ({} reference(s)): expected a free block", dst,
        ref_[d]));
  }
  Unlink(dst);
  DropIdentity(dst);
  ref_[d] = ref_[s];
  Held(dst);
  if (has_key_[s]) HandIdentity(src, dst);
  ref_[s] = 0;
  Prepend(src);  // worthless now: reused before anything cached
  Released(src);
  return Status::Ok();
}

Status BlockPool::MoveCached(int32_t src, int32_t dst) {
  if (!ValidBlock(src)) return BadBlock(src, "move cached");
  if (!ValidBlock(dst)) return BadBlock(dst, "move cached");
  const size_t s = static_cast<size_t>(src), d = static_cast<size_t>(dst);
  if (src == dst) {
    return Status::InvalidArgument(
        fmt::format("move cached: block {} is both source and destination", src));
  }
  if (!on_list_[s] || !has_key_[s]) {
    return Status::FailedPrecondition(fmt::format(
        "move cached: source block {} is {}: only free blocks with a prefix identity move", src,
        ref_[s] > 0 ? "held" : (on_list_[s] ? "free without identity" : "dormant")));
  }
  if (!on_list_[d]) {
    return Status::FailedPrecondition(
        fmt::format("move cached: destination block {} is {}: expected a free block", dst,
                    ref_[d] > 0 ? "held" : "in a segment this pool does not own"));
  }
  for (const auto& [role, b] : {std::pair{"source", src}, std::pair{"destination", dst}}) {
    if (seg_held_[Seg(segment_of(b))] == 0) {
      return Status::FailedPrecondition(fmt::format(
          "move cached: the {} block {} is in segment {}, which holds no block (compaction moves "
          "a segment's cached blocks before its held ones, into segments still in use)",
          role, b, segment_of(b)));
    }
  }
  Unlink(dst);
  DropIdentity(dst);
  const uint64_t tick = tick_[s];
  const int32_t after = prev_[s];  // dst is off the list, so never src's neighbour now
  Unlink(src);
  HandIdentity(src, dst);
  // Linked where src was: its successors' order is untouched, and a plain-end mark that pointed
  // at src (reset by Unlink to an earlier block) still lies before every tick it has to pass.
  Link(dst, after, tick);
  Prepend(src);  // worthless now: reused before anything cached
  return Status::Ok();
}

void BlockPool::ResetPrefixCache() {
  ++identity_epoch_;
  index_.Clear();
  std::fill(has_key_.begin(), has_key_.end(), 0);
  std::fill(continuations_.begin(), continuations_.end(), 0);
  std::fill(share_.begin(), share_.end(), 0);
  std::fill(seg_cached_.begin(), seg_cached_.end(), 0);
  std::fill(seg_cached_queued_.begin(), seg_cached_queued_.end(), 0);
  num_queued_cached_ = 0;
  num_free_cached_ = 0;
  while (empty_head_[kEmptyCached] >= 0)
    MoveSegment(empty_head_[kEmptyCached], kEmptyUncached);
  cached_in_empty_ = 0;  // the segments' counts were zeroed before they moved
  if (ranked()) {
    // Ticks that are ranks or bonuses may lie ahead of the clock: blocks freed from now on would
    // queue before these, which are worth nothing now. They join the head run, in their order.
    for (int32_t b = head_; b >= 0; b = next_[static_cast<size_t>(b)])
      tick_[static_cast<size_t>(b)] = 0;
    head_run_end_ = tail_;
    plain_end_ = -1;
  }
  Record(KvEvent::Kind::kCleared, {}, 0);
}

Status BlockPool::AddSegment(int32_t segment) {
  HKV_RETURN_IF_ERROR(CheckSegmentId(segment, "add segment"));
  if (segment_owned(segment)) {
    return Status::FailedPrecondition(
        fmt::format("add segment: segment {} is already owned by this pool", segment));
  }
  index_.Reserve(num_owned_ + segment_blocks_);
  seg_tick_[Seg(segment)] = *clock_;
  MoveSegment(segment, kEmptyUncached);
  const int32_t first = segment * segment_blocks_ + 1;
  for (int32_t b = first + segment_blocks_ - 1; b >= first; --b)
    Prepend(b);  // reversed, so the head runs in id order
  num_owned_ += segment_blocks_;
  return Status::Ok();
}

Status BlockPool::RemoveSegment(int32_t segment) {
  HKV_RETURN_IF_ERROR(CheckSegmentId(segment, "remove segment"));
  if (!segment_owned(segment)) {
    return Status::FailedPrecondition(
        fmt::format("remove segment: segment {} is not owned by this pool", segment));
  }
  if (segment_held(segment) > 0) {
    return Status::FailedPrecondition(fmt::format(
        "remove segment: segment {} still has {} held block(s)", segment, segment_held(segment)));
  }
  const int32_t first = segment * segment_blocks_ + 1;
  for (int32_t b = first; b < first + segment_blocks_; ++b) {
    DropIdentity(b);
    Unlink(b);
  }
  MoveSegment(segment, kUnowned);
  num_owned_ -= segment_blocks_;
  if (fill_ == segment) fill_ = -1;
  return Status::Ok();
}

std::vector<int32_t> BlockPool::FreeListOrder() const {
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(num_free_));
  for (int32_t b = head_; b >= 0; b = next_[static_cast<size_t>(b)])
    order.push_back(b);
  return order;
}

std::vector<KvEvent> BlockPool::TakeEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

namespace {

Status InvariantFailure(std::string what) {
  return Status::FailedPrecondition("pool invariant: " + what);
}

}  // namespace

// Walks the free list: links agree in both directions, no block twice, only free blocks.
Status BlockPool::CheckFreeList() const {
  const auto fail = InvariantFailure;
  if (ref_[0] != 0 || on_list_[0] || has_key_[0]) return fail("the null block is in use");
  int32_t walked = 0;
  int32_t previous = -1;
  int32_t head_run_end = -1;
  for (int32_t b = head_; b >= 0; b = next_[static_cast<size_t>(b)]) {
    const size_t i = static_cast<size_t>(b);
    if (b <= kNullBlock || b >= num_blocks()) return fail(fmt::format("free list holds id {}", b));
    if (!on_list_[i]) return fail(fmt::format("block {} is linked but not marked free", b));
    if (prev_[i] != previous) return fail(fmt::format("block {} has a broken back link", b));
    // Past the head run the list is in tick order: times (LRU) or ranks (set_eviction_rank).
    if (previous >= 0 && tick_[i] != 0 && tick_[static_cast<size_t>(previous)] > tick_[i])
      return fail(fmt::format("block {} is queued before block {} of a lower tick", previous, b));
    if (tick_[i] == 0) {
      if (head_run_end != previous) {
        return fail(
            fmt::format("block {} was queued at the head but follows a block queued at "
                        "the tail",
                        b));
      }
      head_run_end = b;
    }
    if (ref_[i] != 0)
      return fail(fmt::format("block {} is on the free list with ref {}", b, ref_[i]));
    if (++walked > num_blocks()) return fail("the free list has a cycle");
    previous = b;
  }
  if (previous != tail_) return fail("the free list's tail is not its last block");
  if (plain_end_ >= 0) {
    const size_t p = static_cast<size_t>(plain_end_);
    if (!on_list_[p] || tick_[p] == 0 || tick_[p] > *clock_) {
      return fail(
          fmt::format("block {}, where blocks without a bonus queue, is not a free block "
                      "queued at the tail by now",
                      plain_end_));
    }
  }
  if (head_run_end != head_run_end_) {
    return fail(fmt::format("the blocks queued at the head end at {}, not at {}", head_run_end,
                            head_run_end_));
  }
  if (walked != num_free_) {
    return fail(fmt::format("{} blocks on the free list but num_free is {}", walked, num_free_));
  }
  return Status::Ok();
}

// Every block is exactly free or exactly held, and its identity is the index's; tallies them.
Status BlockPool::CountBlocks(InvariantCounts& c) const {
  const auto fail = InvariantFailure;
  c.held.assign(seg_held_.size(), 0);
  c.cached.assign(seg_held_.size(), 0);
  c.queued.assign(seg_held_.size(), 0);
  for (int32_t b = 1; b < num_blocks(); ++b) {
    const size_t i = static_cast<size_t>(b);
    const size_t seg = Seg(segment_of(b));
    if (ref_[i] < 0) return fail(fmt::format("block {} has ref {}", b, ref_[i]));
    if (seg_list_[seg] == kUnowned) {
      if (ref_[i] != 0 || on_list_[i] || has_key_[i]) {
        return fail(fmt::format("block {} of unowned segment {} is in use", b, seg));
      }
      continue;
    }
    if ((ref_[i] == 0) != (on_list_[i] != 0)) {
      return fail(fmt::format("block {} is neither exactly free nor exactly held", b));
    }
    c.marked += on_list_[i];
    c.held[seg] += ref_[i] > 0 ? 1 : 0;
    if (has_key_[i]) {
      ++c.identities;
      ++c.cached[seg];
      c.free_cached += on_list_[i];
      c.queued[seg] += on_list_[i] && tick_[i] != 0 ? 1 : 0;
      if (index_.Find(key_[i]) != b) {
        return fail(fmt::format("block {} has an identity the index does not map to it", b));
      }
    } else if (continuations_[i] != 0 || share_[i] != 0) {
      return fail(fmt::format("block {} has no identity but counts {} continuation(s), level {}", b,
                              continuations_[i], share_[i]));
    }
  }
  if (c.free_cached != num_free_cached_) {
    return fail(fmt::format("{} free blocks are cached but the count says {}", c.free_cached,
                            num_free_cached_));
  }
  int32_t queued = 0;
  for (int32_t q : c.queued)
    queued += q;
  if (queued != num_queued_cached_) {
    return fail(fmt::format("{} cached free blocks are queued at the tail but the count says {}",
                            queued, num_queued_cached_));
  }
  return Status::Ok();
}

// Each owned segment's counts and list match its blocks; counts the empty ones into `empty`.
Status BlockPool::CheckSegments(const InvariantCounts& c, int32_t& empty) const {
  const auto fail = InvariantFailure;
  int32_t owned = 0;
  for (size_t seg = 0; seg < seg_held_.size(); ++seg) {
    const uint8_t list = seg_list_[seg];
    if (list == kUnowned) continue;
    owned += segment_blocks_;
    if (c.held[seg] != seg_held_[seg] || c.cached[seg] != seg_cached_[seg] ||
        c.queued[seg] != seg_cached_queued_[seg]) {
      return fail(fmt::format(
          "segment {} counts {} held, {} cached and {} queued cached blocks, has {}, {} and {}",
          seg, seg_held_[seg], seg_cached_[seg], seg_cached_queued_[seg], c.held[seg],
          c.cached[seg], c.queued[seg]));
    }
    const uint8_t want =
        c.held[seg] > 0 ? kPartlyHeld : (c.cached[seg] > 0 ? kEmptyCached : kEmptyUncached);
    if (list != want) return fail(fmt::format("segment {} is on the wrong list", seg));
    empty += list != kPartlyHeld ? 1 : 0;
  }
  int32_t stranded = 0;
  for (int32_t b = head_; b >= 0; b = next_[static_cast<size_t>(b)]) {
    if (!has_key_[static_cast<size_t>(b)] && c.held[Seg(segment_of(b))] > 0) ++stranded;
  }
  if (stranded != StrandedBlocks()) {
    return fail(fmt::format("{} free blocks are stranded but the count says {}", stranded,
                            StrandedBlocks()));
  }
  if (owned != num_owned_) {
    return fail(fmt::format("{} blocks owned but the count says {}", owned, num_owned_));
  }
  return Status::Ok();
}

// The empty-segment lists link both ways and hold the `empty` segments.
Status BlockPool::CheckEmptySegmentLists(int32_t empty) const {
  const auto fail = InvariantFailure;
  int32_t listed = 0;
  for (uint8_t list : {kEmptyUncached, kEmptyCached}) {
    int32_t before = -1;
    for (int32_t seg = empty_head_[list]; seg >= 0; seg = seg_next_[Seg(seg)]) {
      if (seg_list_[Seg(seg)] != list || seg_prev_[Seg(seg)] != before) {
        return fail(fmt::format("empty-segment list {} is broken at segment {}", list, seg));
      }
      // Cached empty segments are evicted oldest first, so their list keeps clock order.
      if (list == kEmptyCached && before >= 0 && seg_tick_[Seg(before)] > seg_tick_[Seg(seg)]) {
        return fail(
            fmt::format("cached empty segments {} and {} are out of age order", before, seg));
      }
      if (list == kEmptyCached && rank_ != nullptr && seg_tick_[Seg(seg)] != 0 &&
          seg_tick_[Seg(seg)] != MaxQueuedTick(seg)) {
        return fail(fmt::format("cached empty segment {} has tick {}, its highest rank is {}", seg,
                                seg_tick_[Seg(seg)], MaxQueuedTick(seg)));
      }
      if (++listed > num_segments()) return fail("an empty-segment list has a cycle");
      before = seg;
    }
    if (before != empty_tail_[list]) return fail("an empty-segment list's tail is wrong");
  }
  if (listed != empty || listed != num_empty_) {
    return fail(fmt::format("{} empty segments, {} listed, count {}", empty, listed, num_empty_));
  }
  return Status::Ok();
}

// The index holds exactly the `identities` blocks with an identity, each under its own.
Status BlockPool::CheckIndex(int32_t identities) const {
  if (identities != index_.size()) {
    return InvariantFailure(fmt::format("{} blocks have identities but the index has {} entries",
                                        identities, index_.size()));
  }
  Status entries = Status::Ok();
  index_.ForEach([&](const PrefixKey& key, int32_t b) {
    if (!entries.ok()) return;
    if (b <= kNullBlock || b >= num_blocks() || !has_key_[static_cast<size_t>(b)] ||
        !(key_[static_cast<size_t>(b)] == key)) {
      entries = InvariantFailure(
          fmt::format("index entry points at block {}, which holds another identity", b));
    }
  });
  return entries;
}

Status BlockPool::CheckInvariants() const {
  HKV_RETURN_IF_ERROR(CheckFreeList());
  InvariantCounts counts;
  HKV_RETURN_IF_ERROR(CountBlocks(counts));
  int32_t empty = 0;
  HKV_RETURN_IF_ERROR(CheckSegments(counts, empty));
  HKV_RETURN_IF_ERROR(CheckEmptySegmentLists(empty));
  if (counts.marked != num_free_) {
    return InvariantFailure("free marks and the free list disagree");
  }
  return CheckIndex(counts.identities);
}

Status BlockPool::CheckInvariants(std::span<const int32_t> expected_ref_counts) const {
  HKV_RETURN_IF_ERROR(CheckInvariants());
  if (expected_ref_counts.size() != ref_.size()) {
    return Status::InvalidArgument(fmt::format("expected {} reference counts, got {}", ref_.size(),
                                               expected_ref_counts.size()));
  }
  for (size_t b = 1; b < ref_.size(); ++b) {
    if (ref_[b] != expected_ref_counts[b]) {
      return Status::FailedPrecondition(
          fmt::format("pool invariant: block {} has ref {} but {} holder(s)", b, ref_[b],
                      expected_ref_counts[b]));
    }
  }
  return Status::Ok();
}

}  // namespace hkv
