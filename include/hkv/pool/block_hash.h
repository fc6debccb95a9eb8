// BlockHash: the prefix identity of a full KV block.
//
// Contract: HashBlock chains a block to its parent: the digest covers the parent's digest, the
// block's token ids in order, and the extra keys that change what the cache holds for those
// tokens (adapter id, multimodal items overlapping the block with their offsets, and a cache
// salt, which callers pass for a sequence's first block only). Every field is tagged and
// length-prefixed before hashing, so different inputs never encode to the same bytes; the digest
// is 128 bits of XXH3, so accidental collisions are out of reach for any cache size. The digest
// does not depend on the KV group: PrefixKey adds the group, so one chain computed per request
// serves every group with the same block size while their index entries stay apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace hkv {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// Parent of a sequence's first block.
inline constexpr BlockHash kRootHash{};

// A multimodal input (image, audio clip) whose placeholder tokens overlap a block.
struct MultimodalItem {
  BlockHash content;   // digest of the item's data, computed by the caller
  int64_t offset = 0;  // position of the item's first token relative to the block's first token
};

struct BlockExtraKeys {
  uint64_t adapter_id = 0;                // LoRA/adapter; 0 is the base model
  std::span<const MultimodalItem> items;  // items overlapping this block, in position order
  std::string_view cache_salt;            // isolates tenants; pass it for the first block only
};

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                    const BlockExtraKeys& extra = {});

// The digest of a block identity an engine computed itself (vLLM's chained SHA-256 bytes, say):
// equal bytes give equal digests, so the engine's rules for what makes two blocks equal hold.
BlockHash DigestOf(std::span<const unsigned char> engine_hash);

// What the prefix index is keyed by: a digest within one KV group.
struct PrefixKey {
  BlockHash hash;
  int32_t group = 0;
  bool operator==(const PrefixKey&) const = default;
};

struct PrefixKeyHash {
  // The digest is already uniformly distributed; fold in the group so groups spread too.
  size_t operator()(const PrefixKey& k) const {
    return static_cast<size_t>(k.hash.lo ^ (k.hash.hi >> 1) ^
                               (static_cast<uint64_t>(k.group) * 0x9E3779B97F4A7C15ull));
  }
};

}  // namespace hkv
