#include "block_pool.h"

#include <fmt/format.h>

namespace hkv::vllm {

BlockPool::BlockPool(int32_t num_blocks)
    : meta_(static_cast<size_t>(num_blocks) + 2),
      num_blocks_(num_blocks),
      head_(num_blocks),
      tail_(num_blocks + 1),
      cached_(num_blocks) {
  // The queue starts in block id order; the null block is popped off it for good.
  meta_[static_cast<size_t>(head_)].next = tail_;
  meta_[static_cast<size_t>(tail_)].prev = head_;
  for (int32_t b = 0; b < num_blocks; ++b)
    Append(b);
  Unlink(kNullBlock);
  meta_[kNullBlock].ref_cnt = 0;
}

bool BlockPool::is_free(int32_t block) const {
  return meta_[static_cast<size_t>(block)].prev >= 0;
}

void BlockPool::LinkAfter(int32_t block, int32_t prev) {
  Meta& m = meta_[static_cast<size_t>(block)];
  const int32_t next = meta_[static_cast<size_t>(prev)].next;
  m.prev = prev;
  m.next = next;
  meta_[static_cast<size_t>(prev)].next = block;
  meta_[static_cast<size_t>(next)].prev = block;
  ++num_free_;
}

void BlockPool::Append(int32_t block) {
  LinkAfter(block, meta_[static_cast<size_t>(tail_)].prev);
}

void BlockPool::Prepend(int32_t block) {
  LinkAfter(block, head_);
}

void BlockPool::Demote(int32_t block) {
  if (block == kNullBlock || !is_free(block)) return;
  Unlink(block);
  Prepend(block);
}

void BlockPool::Unlink(int32_t block) {
  Meta& m = meta_[static_cast<size_t>(block)];
  meta_[static_cast<size_t>(m.prev)].next = m.next;
  meta_[static_cast<size_t>(m.next)].prev = m.prev;
  m.prev = m.next = -1;
  --num_free_;
}

void BlockPool::Cache(int32_t block, const PrefixKey& key) {
  Meta& m = meta_[static_cast<size_t>(block)];
  m.has_hash = true;
  m.key = key;
  m.dup_next = -1;
  m.shared = false;
  const int32_t first = cached_.Emplace(key, block);
  if (first < 0) return;
  // A second request computed the same prefix.
  m.shared = true;
  meta_[static_cast<size_t>(first)].shared = true;
  // vLLM keeps every block of an identity (tables stay append-only); the first one serves hits.
  int32_t b = first;
  while (meta_[static_cast<size_t>(b)].dup_next >= 0)
    b = meta_[static_cast<size_t>(b)].dup_next;
  meta_[static_cast<size_t>(b)].dup_next = block;
  ++num_duplicates_;
}

void BlockPool::MaybeEvict(int32_t block) {
  Meta& m = meta_[static_cast<size_t>(block)];
  if (!m.has_hash) return;
  const int32_t first = cached_.Find(m.key);
  if (first == block) {
    cached_.Erase(m.key);
    if (m.dup_next >= 0) {
      cached_.Insert(m.key, m.dup_next);
      --num_duplicates_;
    }
  } else {
    int32_t b = first;
    while (b >= 0 && meta_[static_cast<size_t>(b)].dup_next != block)
      b = meta_[static_cast<size_t>(b)].dup_next;
    if (b < 0) return;  // not in the map: vLLM leaves its hash as it is
    meta_[static_cast<size_t>(b)].dup_next = m.dup_next;
    --num_duplicates_;
  }
  if (events_ != nullptr) {
    CacheEvent e;
    e.kind = CacheEvent::Kind::kRemoved;
    e.group = m.key.group;
    e.blocks.push_back(block);
    events_->push_back(std::move(e));
  }
  m.dup_next = -1;
  m.has_hash = false;
  m.shared = false;
  m.key = {};
}

void BlockPool::GetNewBlocks(int32_t n, std::vector<int32_t>& out) {
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = meta_[static_cast<size_t>(head_)].next;
    Unlink(b);
    MaybeEvict(b);
    meta_[static_cast<size_t>(b)].ref_cnt = 1;
    out.push_back(b);
  }
}

void BlockPool::Touch(int32_t block) {
  if (block == kNullBlock) return;
  Meta& m = meta_[static_cast<size_t>(block)];
  if (m.ref_cnt == 0) Unlink(block);
  ++m.ref_cnt;
  m.shared = m.shared || m.has_hash;  // a hit: another request reached this prefix
}

bool BlockPool::ResetPrefixCache() {
  if (num_free_ != num_blocks_ - 1) return false;
  cached_.Clear();
  num_duplicates_ = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    Meta& m = meta_[static_cast<size_t>(b)];
    m.has_hash = false;
    m.shared = false;
    m.key = {};
    m.dup_next = -1;
  }
  if (events_ != nullptr) {
    CacheEvent e;
    e.kind = CacheEvent::Kind::kAllCleared;
    events_->push_back(std::move(e));
  }
  return true;
}

std::vector<int32_t> BlockPool::FreeQueue() const {
  std::vector<int32_t> out;
  for (int32_t b = meta_[static_cast<size_t>(head_)].next; b != tail_;
       b = meta_[static_cast<size_t>(b)].next)
    out.push_back(b);
  return out;
}

Status BlockPool::Check(const std::vector<int32_t>& holders) const {
  std::vector<char> in_queue(static_cast<size_t>(num_blocks_), 0);
  int32_t count = 0;
  int32_t prev = head_;
  for (int32_t b = meta_[static_cast<size_t>(head_)].next; b != tail_;
       b = meta_[static_cast<size_t>(b)].next) {
    if (b < 0 || b >= num_blocks_ || b == kNullBlock || in_queue[static_cast<size_t>(b)] ||
        meta_[static_cast<size_t>(b)].prev != prev) {
      return Status::FailedPrecondition(fmt::format("vllm pool: free queue broken at block {}", b));
    }
    in_queue[static_cast<size_t>(b)] = 1;
    prev = b;
    ++count;
  }
  if (count != num_free_) {
    return Status::FailedPrecondition(
        fmt::format("vllm pool: {} blocks in the free queue, {} counted free", count, num_free_));
  }
  for (int32_t b = 1; b < num_blocks_; ++b) {
    const Meta& m = meta_[static_cast<size_t>(b)];
    if (m.ref_cnt != holders[static_cast<size_t>(b)]) {
      return Status::FailedPrecondition(
          fmt::format("vllm pool: block {} has ref count {} but {} holders", b, m.ref_cnt,
                      holders[static_cast<size_t>(b)]));
    }
    if ((m.ref_cnt == 0) != (in_queue[static_cast<size_t>(b)] != 0)) {
      return Status::FailedPrecondition(
          fmt::format("vllm pool: block {} with ref count {} is {} the free queue", b, m.ref_cnt,
                      in_queue[static_cast<size_t>(b)] ? "in" : "not in"));
    }
  }
  int32_t mapped = 0;
  Status st;
  cached_.ForEach([&](const PrefixKey& key, int32_t first) {
    for (int32_t b = first; b >= 0 && st.ok(); b = meta_[static_cast<size_t>(b)].dup_next) {
      const Meta& m = meta_[static_cast<size_t>(b)];
      if (!m.has_hash || !(m.key == key)) {
        st = Status::FailedPrecondition(
            fmt::format("vllm pool: the prefix map names block {} for another identity", b));
      }
      ++mapped;
    }
  });
  HKV_RETURN_IF_ERROR(st);
  int32_t hashed = 0;
  for (int32_t b = 0; b < num_blocks_; ++b)
    hashed += meta_[static_cast<size_t>(b)].has_hash;
  if (hashed != mapped || mapped != num_cached()) {
    return Status::FailedPrecondition(fmt::format(
        "vllm pool: {} blocks carry an identity, the prefix map holds {}", hashed, mapped));
  }
  return Status::Ok();
}

}  // namespace hkv::vllm
