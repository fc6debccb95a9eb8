// The AVX2 build of XXH3 (compiled with -mavx2; see xxh3_dispatch.h). Only xxHash's own inline C
// code lives here: no C++ templates or inline functions that the linker could share with code
// built for the baseline and so run on a CPU without AVX2.
#define XXH_INLINE_ALL
#include <immintrin.h>
#include <string.h>
#include <xxhash.h>

namespace hkv::connector_format {

unsigned long long Xxh3WithSeedAvx2(const void* data, size_t len, unsigned long long seed) {
  return XXH3_64bits_withSeed(data, len, seed);
}

void Xxh3UpdateAvx2(XXH3_state_t* state, const void* data, size_t len) {
  (void)XXH3_64bits_update(state, data, len);
}

void CopyStreamingAvx2(void* dst, const void* src, size_t len) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (len < head + 64) {
    memcpy(d, s, len);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  len -= head;
  size_t i = 0;
  for (; i + 64 <= len; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  memcpy(d + i, s + i, len - i);
  _mm_sfence();
}

}  // namespace hkv::connector_format
