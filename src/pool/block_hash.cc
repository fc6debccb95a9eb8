#include <bit>
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

// Serialises the fields into a stack buffer and hashes it in one shot, which is several times
// faster than streaming small updates; inputs longer than the buffer (huge blocks, long salts)
// spill into a streaming state. XXH3 digests a byte sequence the same either way.
class Digest {
 public:
  Digest() = default;
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void Tagged(Tag tag) { Fixed<1>(&tag); }
  void U64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<uint8_t>(v >> (8 * i));  // little endian
    Fixed<8>(b);
  }
  void U32(uint32_t v) {
    uint8_t b[4];
    for (int i = 0; i < 4; ++i)
      b[i] = static_cast<uint8_t>(v >> (8 * i));
    Fixed<4>(b);
  }
  void Hash(const BlockHash& h) {
    U64(h.lo);
    U64(h.hi);
  }
  void Bytes(const void* data, size_t size) {
    if (size == 0) return;  // an empty span may carry a null pointer, which memcpy must not see
    if (used_ + size > sizeof(buf_)) Spill();
    if (size > sizeof(buf_)) {
      XXH3_128bits_update(&state_, data, size);
      return;
    }
    std::memcpy(buf_ + used_, data, size);
    used_ += size;
  }
  // Fields of a known size: a fixed-size copy the compiler inlines (Bytes' variable-size one is
  // a library call, and a block's digest has five such fields to one token list).
  template <size_t N>
  void Fixed(const void* data) {
    if (used_ + N > sizeof(buf_)) Spill();
    std::memcpy(buf_ + used_, data, N);
    used_ += N;
  }
  BlockHash Finish() {
    XXH128_hash_t h;
    if (!streaming_) {
      h = XXH3_128bits(buf_, used_);
    } else {
      XXH3_128bits_update(&state_, buf_, used_);
      h = XXH3_128bits_digest(&state_);
    }
    return {h.low64, h.high64};
  }

 private:
  void Spill() {
    if (!streaming_) {
      XXH3_INITSTATE(&state_);
      XXH3_128bits_reset(&state_);
      streaming_ = true;
    }
    XXH3_128bits_update(&state_, buf_, used_);
    used_ = 0;
  }

  uint8_t buf_[512];
  size_t used_ = 0;
  bool streaming_ = false;
  XXH3_state_t state_;  // the state lives on the stack: hashing a block must not allocate
};

}  // namespace

BlockHash DigestOf(std::span<const unsigned char> engine_hash) {
  const XXH128_hash_t h = XXH3_128bits(engine_hash.data(), engine_hash.size());
  return BlockHash{h.low64, h.high64};
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                    const BlockExtraKeys& extra) {
  // Nearly every block is the parent and its tokens alone: the same bytes Digest would lay out,
  // written straight into one buffer of known shape.
  constexpr size_t kHead = 1 + 16 + 1 + 8;
  constexpr size_t kMaxTokens = 128;
  if (std::endian::native == std::endian::little && extra.adapter_id == 0 && extra.items.empty() &&
      extra.cache_salt.empty() && tokens.size() <= kMaxTokens) {
    uint8_t buf[kHead + 4 * kMaxTokens];
    const uint64_t n = tokens.size();
    buf[0] = kParent;
    std::memcpy(buf + 1, &parent.lo, 8);
    std::memcpy(buf + 9, &parent.hi, 8);
    buf[17] = kTokens;
    std::memcpy(buf + 18, &n, 8);
    if (n > 0) std::memcpy(buf + kHead, tokens.data(), tokens.size_bytes());
    const XXH128_hash_t h = XXH3_128bits(buf, kHead + tokens.size_bytes());
    return {h.low64, h.high64};
  }
  Digest d;
  d.Tagged(kParent);
  d.Hash(parent);
  d.Tagged(kTokens);
  d.U64(tokens.size());
  // Tokens go in as 4-byte little-endian words: on a little-endian host that is their memory.
  if constexpr (std::endian::native == std::endian::little) {
    d.Bytes(tokens.data(), tokens.size_bytes());
  } else {
    for (int32_t t : tokens)
      d.U32(static_cast<uint32_t>(t));
  }
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
