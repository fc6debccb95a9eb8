// The entry header shared by tier-transfer messages and tier streams: a key, a length and a
// checksum over both, so a damaged header is told from a damaged entry.
//
// Contract: PutEntryHeader writes kEntryBytes at `p`; ReadEntryHeader checks the checksum and
// returns false (changing nothing) when it fails. `flags` is 0 for an entry; a stream's end marker
// sets kEndOfStream.
#pragma once

#include <cstdint>

#include <hkv/pool/block_hash.h>

#include "checked_format.h"

namespace hkv::connector_format {

inline constexpr size_t kEntryBytes = 40;  // hi, lo, group, flags, length, checksum of the 32
inline constexpr uint32_t kEndOfStream = 1;

struct EntryHeader {
  PrefixKey key;
  uint32_t flags = 0;
  uint64_t length = 0;
};

inline void PutEntryHeader(unsigned char* p, const EntryHeader& h) {
  Put64(p, h.key.hash.hi);
  Put64(p + 8, h.key.hash.lo);
  Put32(p + 16, static_cast<uint32_t>(h.key.group));
  Put32(p + 20, h.flags);
  Put64(p + 24, h.length);
  Put64(p + 32, HeaderSeed({p, 32}));
}

inline bool ReadEntryHeader(const unsigned char* p, EntryHeader& out) {
  if (Get64(p + 32) != HeaderSeed({p, 32})) return false;
  out.key.hash.hi = Get64(p);
  out.key.hash.lo = Get64(p + 8);
  out.key.group = static_cast<int32_t>(Get32(p + 16));
  out.flags = Get32(p + 20);
  out.length = Get64(p + 24);
  return true;
}

}  // namespace hkv::connector_format
