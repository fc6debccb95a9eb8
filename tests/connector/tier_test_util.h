// Shared by the tier tests: keys, byte strings, a fresh temporary directory per test, and the
// ways a disk tier's file gets damaged behind its back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include <hkv/connector/disk_tier.h>
#include <hkv/pool/block_hash.h>

#include "test_model.h"

namespace hkv::testing {

inline PrefixKey K(uint64_t n) {
  return PrefixKey{BlockHash{n, n * 3}, static_cast<int32_t>(n % 2)};
}
inline DiskTierOptions DiskOptions(int64_t capacity, uint64_t model = 1) {
  DiskTierOptions o;
  o.capacity_bytes = capacity;
  o.model = TestModel(model);
  return o;
}
inline std::vector<unsigned char> Bytes(size_t n, unsigned char fill) {
  return std::vector<unsigned char>(n, fill);
}

// A directory of its own under the test temp dir, named after the running test; removed with
// everything in it when the object goes.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("hkv_") + info->test_suite_name() + "_" + info->name() + "_" +
                       std::to_string(::getpid());
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterised tests have '/' in their names
    }
    path_ = std::filesystem::path(::testing::TempDir()) / name;
    std::filesystem::remove_all(path_);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

enum class Damage { kFlipByte, kTruncate, kDelete };
inline constexpr Damage kDamages[] = {Damage::kFlipByte, Damage::kTruncate, Damage::kDelete};

// Damages the file at `path`; `at` picks the byte flipped or the length kept (modulo the size).
inline void DamageFile(const std::filesystem::path& path, Damage damage, uint64_t at) {
  const auto size = std::filesystem::file_size(path);
  switch (damage) {
    case Damage::kFlipByte: {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      const auto pos = static_cast<std::streamoff>(at % size);
      f.seekg(pos);
      const int c = f.get();
      f.seekp(pos);
      f.put(static_cast<char>(c ^ 0x20));
      ASSERT_TRUE(f.good()) << path;
      break;
    }
    case Damage::kTruncate:
      std::filesystem::resize_file(path, at % size);
      break;
    case Damage::kDelete:
      ASSERT_TRUE(std::filesystem::remove(path)) << path;
      break;
  }
}

}  // namespace hkv::testing
