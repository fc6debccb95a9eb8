// SplitMix64: a tiny pseudo-random generator whose output is fixed by its seed on every platform
// and standard library (unlike <random>'s distributions), for reproducible traces, weights and
// workloads.
#pragma once

#include <cstdint>

namespace hkv {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n >= 1.
  int32_t Below(int32_t n) { return static_cast<int32_t>(Next() % static_cast<uint64_t>(n)); }
  // The generator's position, e.g. to derive an independent generator from it.
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace hkv
