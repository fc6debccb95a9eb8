// ScrambledRank: an eviction order unrelated to recency or prefix order, for tests of
// ManagerConfig::eviction_rank. A block's rank is a fixed scramble of its digest (SplitMix64 seeded
// by it), so a prefix's start may go before its end and a fresh block before a stale one - orders
// LRU never produces, which every hit must still read correctly.
#pragma once

#include <cstdint>

#include <hkv/common/splitmix64.h>
#include <hkv/pool/eviction_rank.h>

namespace hkv::testing {

class ScrambledRank final : public EvictionRank {
 public:
  uint64_t Rank(const BlockHash& d) const override {
    return SplitMix64(d.lo ^ (d.hi * 0x9E3779B97F4A7C15ull)).Next() >> 8;
  }
};

}  // namespace hkv::testing
