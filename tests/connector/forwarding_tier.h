// A test tier that passes every call to another one; a test derives from it and overrides the
// calls it watches or breaks. The batch calls are left to Tier's loops, so an override of Get or
// Put sees every block.
#pragma once

#include <hkv/connector/tier.h>

namespace hkv::testing {

class ForwardingTier : public Tier {
 public:
  explicit ForwardingTier(Tier& inner) : inner_(inner) {}
  bool Contains(const PrefixKey& key) const override { return inner_.Contains(key); }
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override {
    return inner_.Put(key, bytes);
  }
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override { return inner_.Get(key); }
  Status Pin(const PrefixKey& key) override { return inner_.Pin(key); }
  Status Unpin(const PrefixKey& key) override { return inner_.Unpin(key); }
  Status Evict(const PrefixKey& key) override { return inner_.Evict(key); }
  int64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  int64_t used_bytes() const override { return inner_.used_bytes(); }
  std::vector<PrefixKey> LruOrder() const override { return inner_.LruOrder(); }

 protected:
  Tier& inner_;
};

}  // namespace hkv::testing
