#include <cstring>

#include <hkv/pool/block_hash.h>

// Inline the whole of xxHash: one translation unit uses it, and no library needs linking.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hkv {
namespace {

// Tags keep fields apart: a token list can never be read as a salt or an item, whatever bytes
// the caller passes.
enum Tag : uint8_t { kParent = 1, kTokens = 2, kAdapter = 3, kItem = 4, kSalt = 5 };

class Digest {
 public:
  // The state lives on the stack: hashing a block must not allocate.
  Digest() {
    XXH3_INITSTATE(&state_);
    XXH3_128bits_reset(&state_);
  }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void Tagged(Tag tag) { Bytes(&tag, 1); }
  void U64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<uint8_t>(v >> (8 * i));  // little endian
    Bytes(b, 8);
  }
  void Hash(const BlockHash& h) {
    U64(h.lo);
    U64(h.hi);
  }
  void Bytes(const void* data, size_t size) { XXH3_128bits_update(&state_, data, size); }
  BlockHash Finish() {
    const XXH128_hash_t h = XXH3_128bits_digest(&state_);
    return {h.low64, h.high64};
  }

 private:
  XXH3_state_t state_;
};

}  // namespace

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                    const BlockExtraKeys& extra) {
  Digest d;
  d.Tagged(kParent);
  d.Hash(parent);
  d.Tagged(kTokens);
  d.U64(tokens.size());
  // Tokens go in as 4-byte little-endian words, a chunk per update: per-token updates would
  // cost more than the hashing itself.
  uint8_t chunk[256];
  size_t used = 0;
  for (int32_t t : tokens) {
    const auto v = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i)
      chunk[used++] = static_cast<uint8_t>(v >> (8 * i));
    if (used == sizeof(chunk)) {
      d.Bytes(chunk, used);
      used = 0;
    }
  }
  d.Bytes(chunk, used);
  if (extra.adapter_id != 0) {
    d.Tagged(kAdapter);
    d.U64(extra.adapter_id);
  }
  for (const MultimodalItem& item : extra.items) {
    d.Tagged(kItem);
    d.Hash(item.content);
    d.U64(static_cast<uint64_t>(item.offset));
  }
  if (!extra.cache_salt.empty()) {
    d.Tagged(kSalt);
    d.U64(extra.cache_salt.size());
    d.Bytes(extra.cache_salt.data(), extra.cache_salt.size());
  }
  return d.Finish();
}

}  // namespace hkv
