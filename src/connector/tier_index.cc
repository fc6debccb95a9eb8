#include <fmt/format.h>

#include <hkv/connector/tier_index.h>

namespace hkv {

std::string TierKeyName(const PrefixKey& key) {
  return fmt::format("{:016x}{:016x}/group {}", key.hash.hi, key.hash.lo, key.group);
}

void TierIndex::Touch(const PrefixKey& key) {
  lru_.splice(lru_.end(), lru_, entries_.at(key).lru);
}

Result<std::vector<PrefixKey>> TierIndex::Victims(const PrefixKey& key, int64_t bytes) const {
  std::vector<PrefixKey> victims;
  int64_t free = capacity_ - used_;
  for (auto it = lru_.begin(); it != lru_.end() && free < bytes; ++it) {
    const Entry& e = entries_.at(*it);
    if (e.pins > 0) continue;
    free += e.bytes;
    victims.push_back(*it);
  }
  if (free < bytes) {
    return Status::ResourceExhausted(
        fmt::format("{}: {} bytes for {} do not fit: capacity {}, {} used, the rest pinned", name_,
                    bytes, TierKeyName(key), capacity_, used_));
  }
  return victims;
}

void TierIndex::Insert(const PrefixKey& key, int64_t bytes) {
  Entry e;
  e.bytes = bytes;
  e.lru = lru_.insert(lru_.end(), key);
  entries_.emplace(key, e);
  used_ += bytes;
}

void TierIndex::Erase(const PrefixKey& key) {
  if (track_) dropped_.push_back(key);
  auto it = entries_.find(key);
  used_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

Status TierIndex::Pin(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("{}: cannot pin {}, not held", name_, TierKeyName(key)));
  }
  ++it->second.pins;
  return Status::Ok();
}

Status TierIndex::Unpin(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("{}: cannot unpin {}, not held", name_, TierKeyName(key)));
  }
  if (it->second.pins == 0) {
    return Status::FailedPrecondition(
        fmt::format("{}: cannot unpin {}, it is not pinned", name_, TierKeyName(key)));
  }
  --it->second.pins;
  return Status::Ok();
}

Status TierIndex::CheckEvict(const PrefixKey& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return Status::NotFound(fmt::format("{}: cannot evict {}, not held", name_, TierKeyName(key)));
  }
  if (it->second.pins > 0) {
    return Status::FailedPrecondition(fmt::format("{}: cannot evict {}, pinned {} time(s)", name_,
                                                  TierKeyName(key), it->second.pins));
  }
  return Status::Ok();
}

Status TierIndex::Miss(const PrefixKey& key) const {
  return Status::NotFound(fmt::format("{}: no entry for {}", name_, TierKeyName(key)));
}

}  // namespace hkv
