// XXH3-64 on the widest vector unit the CPU has. Debian builds xxHash for baseline SSE2; one file
// (xxh3_avx2.cc) compiles the same inline code for AVX2, chosen at run time when the CPU has it.
// XXH3's digest does not depend on the vector width, so streams, files and values written by
// either path read back with the other. A checksummed copy is bound by the hash: SSE2 XXH3 runs at
// about the speed of a DRAM memcpy here, AVX2 at about three times it.
#pragma once

#include <cstddef>
#include <cstdint>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hkv::connector_format {

uint64_t Xxh3WithSeed(const void* data, size_t len, uint64_t seed);
// XXH3_64bits_update on the dispatched path; reset and digest are XXH3's own.
void Xxh3Update(XXH3_state_t* state, const void* data, size_t len);
// Whether the AVX2 path is in use (tests).
bool Xxh3UsesAvx2();
// memcpy with streaming (non-temporal) stores where AVX2 is there: for a copy whose source was
// just read into cache (hashed) and whose destination is not read again soon, it writes memory
// without first reading the destination lines, as a large memcpy does. Ordered by a store fence
// before it returns.
void CopyStreaming(void* dst, const void* src, size_t len);

}  // namespace hkv::connector_format
