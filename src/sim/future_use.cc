#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include <hkv/sim/future_use.h>

namespace hkv {
namespace {

// Ranks are (N + 2 - next use) above the depth bits: any request's need outranks every depth.
constexpr int kDepthBits = 24;
constexpr uint64_t kDepthMask = (uint64_t{1} << kDepthBits) - 1;

size_t Home(const BlockHash& d, size_t mask) {
  return static_cast<size_t>(d.lo ^ (d.hi >> 1)) & mask;
}

}  // namespace

Result<std::shared_ptr<FutureUse>> FutureUse::Create(const Trace& trace, int32_t hash_tokens) {
  if (hash_tokens < 1) {
    return Status::InvalidArgument(
        fmt::format("future use: hash_tokens {}: expected >= 1", hash_tokens));
  }
  auto f = std::make_shared<FutureUse>();
  f->num_requests_ = static_cast<int64_t>(trace.size());
  f->digests_.resize(trace.size());
  f->admitted_.assign(trace.size(), 0);
  const auto g = static_cast<size_t>(hash_tokens);
  size_t total = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const std::vector<int32_t>& p = trace[i].prompt;
    const size_t n = p.empty() ? 0 : (p.size() - 1) / g;
    std::vector<BlockHash>& d = f->digests_[i];
    d.reserve(n);
    BlockHash h = kRootHash;
    for (size_t k = 0; k < n; ++k) {
      h = HashBlock(h, std::span<const int32_t>(p).subspan(k * g, g));
      d.push_back(h);
    }
    total += n;
  }
  f->table_.resize(std::bit_ceil(std::max<size_t>(2 * total, 16)));
  f->mask_ = f->table_.size() - 1;
  // Two passes: count each prefix's users, then lay them out contiguously in request order.
  for (size_t i = 0; i < trace.size(); ++i) {
    for (size_t k = 0; k < f->digests_[i].size(); ++k) {
      int32_t e = f->FindEntry(f->digests_[i][k]);
      if (e < 0) {
        e = f->InsertEntry(f->digests_[i][k]);
        f->entries_[static_cast<size_t>(e)].depth = static_cast<int32_t>(k + 1);
      }
      ++f->entries_[static_cast<size_t>(e)].end;
    }
  }
  int64_t at = 0;
  for (Entry& e : f->entries_) {
    const int64_t count = e.end;
    e.begin = e.cursor = at;
    e.end = at;
    at += count;
  }
  f->users_.resize(static_cast<size_t>(at));
  for (size_t i = 0; i < trace.size(); ++i) {
    for (const BlockHash& d : f->digests_[i]) {
      Entry& e = f->entries_[static_cast<size_t>(f->FindEntry(d))];
      // A prompt holds each prefix once (digests chain), so a request is listed once per prefix.
      f->users_[static_cast<size_t>(e.end++)] = static_cast<int32_t>(i);
    }
  }
  return f;
}

int32_t FutureUse::FindEntry(const BlockHash& digest) const {
  for (size_t s = Home(digest, mask_);; s = (s + 1) & mask_) {
    const Slot& slot = table_[s];
    if (slot.entry < 0) return -1;
    if (slot.digest == digest) return slot.entry;
  }
}

int32_t FutureUse::InsertEntry(const BlockHash& digest) {
  size_t s = Home(digest, mask_);
  while (table_[s].entry >= 0)
    s = (s + 1) & mask_;
  table_[s] = {digest, static_cast<int32_t>(entries_.size())};
  entries_.emplace_back();
  return table_[s].entry;
}

int64_t FutureUse::NextUse(const BlockHash& digest) const {
  return NextUseOf(FindEntry(digest));
}

int64_t FutureUse::NextUseOf(int32_t e) const {
  if (e < 0) return num_requests_;
  const Entry& en = entries_[static_cast<size_t>(e)];
  for (int64_t u = en.cursor; u < en.end; ++u) {
    const int32_t r = users_[static_cast<size_t>(u)];
    if (!admitted_[static_cast<size_t>(r)]) return r;
  }
  return num_requests_;
}

uint64_t FutureUse::Rank(const BlockHash& digest) const {
  const int32_t e = FindEntry(digest);
  const int64_t next = NextUseOf(e);
  const uint64_t depth =
      e < 0 ? kDepthMask
            : std::min<uint64_t>(static_cast<uint64_t>(entries_[static_cast<size_t>(e)].depth),
                                 kDepthMask);
  return (static_cast<uint64_t>(num_requests_ + 2 - next) << kDepthBits) | (kDepthMask - depth);
}

std::span<const BlockHash> FutureUse::Consume(size_t i) {
  if (i >= admitted_.size()) return {};
  admitted_[i] = 1;
  // Cursors skip the admitted users at their front, so NextUse stays short.
  for (const BlockHash& d : digests_[i]) {
    Entry& e = entries_[static_cast<size_t>(FindEntry(d))];
    while (e.cursor < e.end &&
           admitted_[static_cast<size_t>(users_[static_cast<size_t>(e.cursor)])])
      ++e.cursor;
  }
  return digests_[i];
}

std::span<const BlockHash> FutureUse::Return(size_t i) {
  if (i >= admitted_.size()) return {};
  admitted_[i] = 0;
  // Request i is a user of each of its prefixes again: cursors that passed it come back to it.
  for (const BlockHash& d : digests_[i]) {
    Entry& e = entries_[static_cast<size_t>(FindEntry(d))];
    const auto first = users_.begin() + e.begin, last = users_.begin() + e.end;
    const int64_t at = std::lower_bound(first, last, static_cast<int32_t>(i)) - users_.begin();
    e.cursor = std::min(e.cursor, at);
  }
  return digests_[i];
}

}  // namespace hkv
