// A model identity for connector tests and benchmarks; different n, different models.
#pragma once

#include <cstdint>

#include <hkv/connector/model_identity.h>

namespace hkv::testing {

inline ModelIdentity TestModel(uint64_t n = 1) {
  return ModelIdentity{0x7e57'0000'0000'0000ull | n, n * 0x9E3779B97F4A7C15ull + 1};
}

}  // namespace hkv::testing
