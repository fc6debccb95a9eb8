// Pieces shared by the connector's byte formats (block streams, disk tier files): little-endian
// fixed-width fields, so a file or stream reads the same on any host, and the seeded checksum.
//
// Contract: PutN/GetN write/read N/8 bytes at `p`, little-endian, with no alignment needed.
// HeaderSeed is the XXH3-64 of a header's bytes; seeding the payload's XXH3-64 with it makes one
// 64-bit value cover header and payload, so a flipped bit in either is caught.
#pragma once

#include <cstdint>
#include <span>

#include "xxh3_dispatch.h"

namespace hkv::connector_format {

inline void Put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void Put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint32_t Get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t Get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

inline uint64_t HeaderSeed(std::span<const unsigned char> header) {
  return XXH3_64bits(header.data(), header.size());
}
inline uint64_t SeededChecksum(std::span<const unsigned char> header,
                               std::span<const unsigned char> payload) {
  return Xxh3WithSeed(payload.data(), payload.size(), HeaderSeed(header));
}

}  // namespace hkv::connector_format
