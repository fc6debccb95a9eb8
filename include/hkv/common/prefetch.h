// PrefetchLine: start loading the cache line holding `x`, for loops that know the addresses they
// will touch next (a probe of a table larger than the caches is a memory round trip; a few
// overlapped are little more than one).
//
// On x86-64 an instruction the compiler must keep: GCC dropped __builtin_prefetch from the
// manager's loops.
#pragma once

namespace hkv {

template <typename T>
inline void PrefetchLine(const T& x) {
#if defined(__x86_64__)
  __asm__ volatile("prefetcht0 %0" : : "m"(x));
#else
  __builtin_prefetch(&x);
#endif
}

}  // namespace hkv
