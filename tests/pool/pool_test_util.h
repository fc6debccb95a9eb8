// Helpers the BlockPool tests share: a key per number, and the invariant check.
#pragma once

#include <cstdint>

#include <gtest/gtest.h>

#include <hkv/pool/block_pool.h>

namespace hkv::pool_testing {

inline PrefixKey Key(uint64_t n) {
  return {{n, n * 131 + 3}, 0};
}

inline void ExpectValid(const BlockPool& p) {
  const Status s = p.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s.message();
}

}  // namespace hkv::pool_testing
