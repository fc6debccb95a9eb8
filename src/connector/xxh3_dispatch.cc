#include "xxh3_dispatch.h"

#include <cstring>

namespace hkv::connector_format {

#if defined(__x86_64__)
unsigned long long Xxh3WithSeedAvx2(const void* data, size_t len, unsigned long long seed);
void Xxh3UpdateAvx2(XXH3_state_t* state, const void* data, size_t len);
void CopyStreamingAvx2(void* dst, const void* src, size_t len);
#endif

namespace {

bool HasAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

const bool kAvx2 = HasAvx2();

}  // namespace

bool Xxh3UsesAvx2() {
  return kAvx2;
}

uint64_t Xxh3WithSeed(const void* data, size_t len, uint64_t seed) {
#if defined(__x86_64__)
  if (kAvx2) return Xxh3WithSeedAvx2(data, len, seed);
#endif
  return XXH3_64bits_withSeed(data, len, seed);
}

void CopyStreaming(void* dst, const void* src, size_t len) {
#if defined(__x86_64__)
  if (kAvx2) {
    CopyStreamingAvx2(dst, src, len);
    return;
  }
#endif
  std::memcpy(dst, src, len);
}

void Xxh3Update(XXH3_state_t* state, const void* data, size_t len) {
#if defined(__x86_64__)
  if (kAvx2) {
    Xxh3UpdateAvx2(state, data, len);
    return;
  }
#endif
  (void)XXH3_64bits_update(state, data, len);
}

}  // namespace hkv::connector_format
