// KvEvent: a change to a pool's prefix index - a block published under a key, a key dropped when
// its block was taken for new data, or the whole index cleared - in the order it happened.
//
// Contract: stored/removed events name the pool's block and its key; cleared events neither.
// Its own header so that layers above the pool can pass events on without seeing the pool.
#pragma once

#include <cstdint>
#include <optional>

#include <hkv/pool/block_hash.h>

namespace hkv {

// Who published a block, as a stored event reports it: for the manager, a request, the position
// the block starts at (a checkpoint: its position), the digest of the prefix before it (the
// previous block's key in the same group's chain; none for a first block) and the request's
// adapter (0: the base model). The defaults: an identity that moved with its page (compaction) or
// a publisher that gave none.
struct PublishOrigin {
  uint64_t origin = 0;
  int64_t position = -1;
  std::optional<BlockHash> parent = std::nullopt;
  uint64_t adapter = 0;
};

struct KvEvent {
  enum class Kind : unsigned char { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  PrefixKey key;            // unused for kCleared
  int32_t block = 0;        // unused for kCleared
  PublishOrigin from = {};  // stored events only
};

}  // namespace hkv
