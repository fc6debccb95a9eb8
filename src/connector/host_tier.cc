#include <hkv/connector/host_tier.h>

namespace hkv {

Status HostTier::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  if (index_.Contains(key)) {
    index_.Touch(key);
    return Status::Ok();
  }
  HKV_ASSIGN_OR_RETURN(const std::vector<PrefixKey> victims,
                       index_.Victims(key, static_cast<int64_t>(bytes.size())));
  for (const PrefixKey& v : victims) {
    index_.Erase(v);
    bytes_.erase(v);
  }
  bytes_.emplace(key, std::vector<unsigned char>(bytes.begin(), bytes.end()));
  index_.Insert(key, static_cast<int64_t>(bytes.size()));
  return Status::Ok();
}

Result<std::vector<unsigned char>> HostTier::Get(const PrefixKey& key) {
  auto it = bytes_.find(key);
  if (it == bytes_.end()) return index_.Miss(key);
  index_.Touch(key);
  return it->second;
}

Status HostTier::Evict(const PrefixKey& key) {
  if (Status s = index_.CheckEvict(key); !s.ok()) return s;
  index_.Erase(key);
  bytes_.erase(key);
  return Status::Ok();
}

}  // namespace hkv
