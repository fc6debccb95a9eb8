// KvEvent: a change to a pool's prefix index - a block published under a key, a key dropped when
// its block was taken for new data, or the whole index cleared - in the order it happened.
//
// Contract: stored/removed events name the pool's block and its key; cleared events neither.
// Its own header so that layers above the pool can pass events on without seeing the pool.
#pragma once

#include <cstdint>

#include <hkv/pool/block_hash.h>

namespace hkv {

struct KvEvent {
  enum class Kind : unsigned char { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  PrefixKey key;      // unused for kCleared
  int32_t block = 0;  // unused for kCleared
  // Stored events: who published the block (Publish's origin and position: for the manager, a
  // request and the position the block starts at, or a checkpoint's position); 0 and -1 for an
  // identity that moved with its page (compaction) or a publisher that gave none.
  uint64_t origin = 0;
  int64_t position = -1;
};

}  // namespace hkv
