#include <fmt/format.h>

#include <hkv/connector/host_tier.h>

namespace hkv {
namespace {

std::string Name(const PrefixKey& k) {
  return fmt::format("{:016x}{:016x}/group {}", k.hash.hi, k.hash.lo, k.group);
}

}  // namespace

Status HostTier::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  if (auto it = entries_.find(key); it != entries_.end()) {
    Touch(it->second);
    return Status::Ok();
  }
  const auto size = static_cast<int64_t>(bytes.size());
  // Count what eviction could free before evicting anything, so a refusal changes nothing.
  int64_t freeable = capacity_ - used_;
  for (auto it = lru_.begin(); it != lru_.end() && freeable < size; ++it) {
    const Entry& e = entries_.at(*it);
    if (e.pins == 0) freeable += static_cast<int64_t>(e.bytes.size());
  }
  if (freeable < size) {
    return Status::ResourceExhausted(
        fmt::format("host tier: {} bytes for {} do not fit: capacity {}, {} used, the rest pinned",
                    size, Name(key), capacity_, used_));
  }
  for (auto it = lru_.begin(); it != lru_.end() && capacity_ - used_ < size;) {
    auto e = entries_.find(*it);
    if (e->second.pins > 0) {
      ++it;
      continue;
    }
    used_ -= static_cast<int64_t>(e->second.bytes.size());
    it = lru_.erase(it);
    entries_.erase(e);
  }
  Entry entry;
  entry.bytes.assign(bytes.begin(), bytes.end());
  entry.lru = lru_.insert(lru_.end(), key);
  entries_.emplace(key, std::move(entry));
  used_ += size;
  return Status::Ok();
}

Result<std::vector<unsigned char>> HostTier::Get(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("host tier: no entry for {}", Name(key)));
  }
  Touch(it->second);
  return it->second.bytes;
}

Status HostTier::Pin(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("host tier: cannot pin {}, not held", Name(key)));
  }
  ++it->second.pins;
  return Status::Ok();
}

Status HostTier::Unpin(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("host tier: cannot unpin {}, not held", Name(key)));
  }
  if (it->second.pins == 0) {
    return Status::FailedPrecondition(
        fmt::format("host tier: cannot unpin {}, it is not pinned", Name(key)));
  }
  --it->second.pins;
  return Status::Ok();
}

Status HostTier::Evict(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("host tier: cannot evict {}, not held", Name(key)));
  }
  if (it->second.pins > 0) {
    return Status::FailedPrecondition(
        fmt::format("host tier: cannot evict {}, pinned {} time(s)", Name(key), it->second.pins));
  }
  used_ -= static_cast<int64_t>(it->second.bytes.size());
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return Status::Ok();
}

}  // namespace hkv
