#include <algorithm>

#include <fmt/format.h>

#include <hkv/pool/block_pool.h>

namespace hkv {

Result<BlockPool> BlockPool::Create(int32_t num_blocks, bool record_events) {
  if (num_blocks < 2) {
    return Status::InvalidArgument(fmt::format(
        "block pool of {} blocks: expected at least 2 (block 0 is the null block)", num_blocks));
  }
  return BlockPool(num_blocks, record_events);
}

BlockPool::BlockPool(int32_t num_blocks, bool record_events)
    : ref_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks), -1),
      next_(static_cast<size_t>(num_blocks), -1),
      on_list_(static_cast<size_t>(num_blocks), 0),
      key_(static_cast<size_t>(num_blocks)),
      has_key_(static_cast<size_t>(num_blocks), 0),
      index_(num_blocks),
      record_events_(record_events) {
  for (int32_t b = 1; b < num_blocks; ++b)
    Append(b);
  pending_.assign(static_cast<size_t>(num_blocks), 0);
}

Status BlockPool::CheckBlockId(int32_t block, const char* call) const {
  if (block <= kNullBlock || block >= num_blocks()) {
    return Status::InvalidArgument(
        fmt::format("{}: block {} is {}: expected 1 to {}", call, block,
                    block == kNullBlock ? "the null block" : "out of range", num_blocks() - 1));
  }
  return Status::Ok();
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
  prev_[i] = next_[i] = -1;
  on_list_[i] = 0;
  --num_free_;
}

void BlockPool::Append(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  prev_[i] = tail_;
  next_[i] = -1;
  if (tail_ >= 0)
    next_[static_cast<size_t>(tail_)] = b;
  else
    head_ = b;
  tail_ = b;
  on_list_[i] = 1;
  ++num_free_;
}

void BlockPool::Prepend(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  prev_[i] = -1;
  next_[i] = head_;
  if (head_ >= 0)
    prev_[static_cast<size_t>(head_)] = b;
  else
    tail_ = b;
  head_ = b;
  on_list_[i] = 1;
  ++num_free_;
}

void BlockPool::Record(KvEvent::Kind kind, const PrefixKey& key, int32_t block) {
  if (record_events_) events_.push_back({kind, key, block});
}

void BlockPool::DropIdentity(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  if (!has_key_[i]) return;
  index_.Erase(key_[i]);
  has_key_[i] = 0;
  Record(KvEvent::Kind::kRemoved, key_[i], b);
}

Status BlockPool::Allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0) return Status::InvalidArgument(fmt::format("allocate {} blocks: expected n >= 0", n));
  if (n > num_free_) {
    return Status::ResourceExhausted(fmt::format("allocate {} blocks: only {} free", n, num_free_));
  }
  for (int32_t k = 0; k < n; ++k) {
    const int32_t b = head_;
    Unlink(b);
    DropIdentity(b);  // the lazy eviction happens here, when the block is reused
    ref_[static_cast<size_t>(b)] = 1;
    out.push_back(b);
  }
  return Status::Ok();
}

Status BlockPool::Acquire(int32_t block) {
  HKV_RETURN_IF_ERROR(CheckBlockId(block, "acquire"));
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    if (!has_key_[i]) {
      return Status::FailedPrecondition(fmt::format(
          "acquire: block {} is free and has no prefix identity: allocate instead", block));
    }
    Unlink(block);
  }
  ++ref_[i];
  return Status::Ok();
}

Status BlockPool::Publish(int32_t block, const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(CheckBlockId(block, "publish"));
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] == 0) {
    return Status::FailedPrecondition(
        fmt::format("publish: block {} is free: only held blocks can be published", block));
  }
  if (has_key_[i]) {
    return Status::FailedPrecondition(
        fmt::format("publish: block {} already has a prefix identity", block));
  }
  if (index_.Find(key) >= 0) return Status::Ok();
  index_.Insert(key, block);
  key_[i] = key;
  has_key_[i] = 1;
  Record(KvEvent::Kind::kStored, key, block);
  return Status::Ok();
}

Status BlockPool::Free(std::span<const int32_t> blocks, Retention retention) {
  // Validate everything first: a rejected call must leave every count as it was. `pending_`
  // counts how often each block is listed (linear, no sort); it is zeroed again before return.
  Status bad;
  size_t counted = 0;
  for (; counted < blocks.size(); ++counted) {
    const int32_t b = blocks[counted];
    bad = CheckBlockId(b, "free");
    if (!bad.ok()) break;
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
  if (retention == Retention::kNormal) {
    for (int32_t b : blocks) {
      if (--ref_[static_cast<size_t>(b)] == 0) Append(b);
    }
  } else {
    // Prepending in reverse keeps the listed order at the head.
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (--ref_[static_cast<size_t>(*it)] == 0) Prepend(*it);
    }
  }
  return Status::Ok();
}

void BlockPool::ResetPrefixCache() {
  index_.Clear();
  std::fill(has_key_.begin(), has_key_.end(), 0);
  Record(KvEvent::Kind::kCleared, {}, 0);
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

Status BlockPool::CheckInvariants() const {
  const auto fail = [](std::string what) {
    return Status::FailedPrecondition("pool invariant: " + what);
  };
  if (ref_[0] != 0 || on_list_[0] || has_key_[0]) return fail("the null block is in use");
  // Walk the free list: links agree in both directions, no block twice, only free blocks.
  int32_t walked = 0;
  int32_t previous = -1;
  for (int32_t b = head_; b >= 0; b = next_[static_cast<size_t>(b)]) {
    const size_t i = static_cast<size_t>(b);
    if (b <= kNullBlock || b >= num_blocks()) return fail(fmt::format("free list holds id {}", b));
    if (!on_list_[i]) return fail(fmt::format("block {} is linked but not marked free", b));
    if (prev_[i] != previous) return fail(fmt::format("block {} has a broken back link", b));
    if (ref_[i] != 0)
      return fail(fmt::format("block {} is on the free list with ref {}", b, ref_[i]));
    if (++walked > num_blocks()) return fail("the free list has a cycle");
    previous = b;
  }
  if (previous != tail_) return fail("the free list's tail is not its last block");
  if (walked != num_free_) {
    return fail(fmt::format("{} blocks on the free list but num_free is {}", walked, num_free_));
  }
  int32_t marked = 0;
  int32_t identities = 0;
  for (int32_t b = 1; b < num_blocks(); ++b) {
    const size_t i = static_cast<size_t>(b);
    if (ref_[i] < 0) return fail(fmt::format("block {} has ref {}", b, ref_[i]));
    if ((ref_[i] == 0) != (on_list_[i] != 0)) {
      return fail(fmt::format("block {} is neither exactly free nor exactly held", b));
    }
    marked += on_list_[i];
    if (has_key_[i]) {
      ++identities;
      if (index_.Find(key_[i]) != b) {
        return fail(fmt::format("block {} has an identity the index does not map to it", b));
      }
    }
  }
  if (marked != num_free_) return fail("free marks and the free list disagree");
  if (identities != index_.size()) {
    return fail(fmt::format("{} blocks have identities but the index has {} entries", identities,
                            index_.size()));
  }
  Status entries = Status::Ok();
  index_.ForEach([&](const PrefixKey& key, int32_t b) {
    if (!entries.ok()) return;
    if (b <= kNullBlock || b >= num_blocks() || !has_key_[static_cast<size_t>(b)] ||
        !(key_[static_cast<size_t>(b)] == key)) {
      entries =
          fail(fmt::format("index entry points at block {}, which holds another identity", b));
    }
  });
  return entries;
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
