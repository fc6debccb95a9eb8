// DiskTier beyond the Tier contract (tier_test.cc runs that): the directory it is given, files
// damaged, shortened, deleted or made unreadable behind its back, and write failures.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include <hkv/connector/disk_tier.h>

#include "tier_test_util.h"

namespace hkv {
namespace {

using testing::Bytes;
using testing::K;

DiskTier MustOpen(const std::filesystem::path& dir, int64_t capacity) {
  Result<DiskTier> t = DiskTier::Open(dir, capacity);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(DiskTierTest, CreatesItsDirectoryAndRefusesAFile) {
  testing::ScopedTempDir tmp;
  const auto dir = tmp.path() / "a" / "b";
  DiskTier tier = MustOpen(dir, 100);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  ASSERT_TRUE(tier.Put(K(1), Bytes(10, 1)).ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(tier.PathOf(K(1))));
  EXPECT_EQ(tier.PathOf(K(1)).parent_path(), dir);

  const auto file = tmp.path() / "plain_file";
  std::ofstream(file) << "not a directory";
  Result<DiskTier> refused = DiskTier::Open(file, 100);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(file.string()), std::string::npos);
  // Nor can a directory be made below a file.
  EXPECT_FALSE(DiskTier::Open(file / "sub", 100).ok());
}

TEST(DiskTierTest, StartsEmptyRemovingOnlyItsOwnFiles) {
  testing::ScopedTempDir tmp;
  {
    DiskTier old = MustOpen(tmp.path(), 100);
    ASSERT_TRUE(old.Put(K(1), Bytes(10, 1)).ok());
    ASSERT_TRUE(old.Put(K(2), Bytes(10, 2)).ok());
  }
  const auto temp = std::filesystem::path(MustOpen(tmp.path(), 1).PathOf(K(3)).string() + ".tmp");
  std::ofstream(temp) << "a write cut short";
  std::ofstream(tmp.path() / "notes.txt") << "someone else's";
  DiskTier tier = MustOpen(tmp.path(), 100);
  EXPECT_TRUE(tier.LruOrder().empty());
  EXPECT_EQ(tier.used_bytes(), 0);
  EXPECT_FALSE(std::filesystem::exists(tier.PathOf(K(1))));
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "notes.txt"));
}

// Each damage: the Get misses (never other bytes), the entry and its file go, the counter
// counts it, and the key can be stored again.
TEST(DiskTierTest, DamagedFilesAreMissesAndForgotten) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 10000);
  int64_t expected = 0;
  for (testing::Damage d : testing::kDamages) {
    // Flips: every byte of the 48 + 64 byte file (37 is prime to 112, so at * 37 visits each).
    for (uint64_t at = 0; at < (d == testing::Damage::kFlipByte ? 112u : 3u); ++at) {
      ASSERT_TRUE(tier.Put(K(1), Bytes(64, 7)).ok());
      ASSERT_TRUE(tier.Put(K(2), Bytes(64, 8)).ok());
      ASSERT_TRUE(tier.Pin(K(1)).ok());  // damage wins over a pin: the bytes are gone
      testing::DamageFile(tier.PathOf(K(1)), d, at * 37);
      EXPECT_TRUE(tier.Contains(K(1)));  // found by the Get that reads it
      Result<std::vector<unsigned char>> got = tier.Get(K(1));
      ASSERT_FALSE(got.ok()) << static_cast<int>(d) << " at " << at;
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
      EXPECT_NE(got.status().message().find(tier.PathOf(K(1)).string()), std::string::npos);
      EXPECT_EQ(tier.corruptions_detected(), ++expected);
      EXPECT_FALSE(tier.Contains(K(1)));
      EXPECT_FALSE(std::filesystem::exists(tier.PathOf(K(1))));
      EXPECT_EQ(tier.LruOrder(), std::vector<PrefixKey>{K(2)});
      EXPECT_EQ(tier.used_bytes(), 64);
      ASSERT_TRUE(tier.Put(K(1), Bytes(64, 9)).ok());
      EXPECT_EQ(*tier.Get(K(1)), Bytes(64, 9));
      ASSERT_TRUE(tier.Evict(K(1)).ok());
      ASSERT_TRUE(tier.Evict(K(2)).ok());
    }
  }
}

TEST(DiskTierTest, AFileOfAnotherKeyIsAMiss) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 1000);
  ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
  ASSERT_TRUE(tier.Put(K(3), Bytes(64, 3)).ok());
  // Same length, valid checksum, but the header names K(3).
  std::filesystem::copy_file(tier.PathOf(K(3)), tier.PathOf(K(1)),
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(tier.Get(K(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.corruptions_detected(), 1);
  EXPECT_EQ(*tier.Get(K(3)), Bytes(64, 3));
}

// A header field damaged: the miss names that field (magic, version, key or length; the
// checksum covers the rest).
TEST(DiskTierTest, EachDamagedHeaderFieldIsNamed) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 1000);
  const std::pair<uint64_t, std::string> fields[] = {
      {0, "is not a disk tier file"},
      {8, "is a version 33 disk tier file"},
      {12, "holds another key's entry"},
      {16, "holds another key's entry"},
      {32, "says 96 payload bytes, the entry has 64"}};
  for (const auto& [at, what] : fields) {
    ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
    testing::DamageFile(tier.PathOf(K(1)), testing::Damage::kFlipByte, at);
    const Result<std::vector<unsigned char>> got = tier.Get(K(1));
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
    EXPECT_NE(got.status().message().find(what), std::string::npos) << got.status().message();
  }
}

TEST(DiskTierTest, AnUnreadableFileIsAMiss) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 1000);
  ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
  // A directory where the file was: it opens, but reading it fails (EISDIR).
  std::filesystem::remove(tier.PathOf(K(1)));
  std::filesystem::create_directory(tier.PathOf(K(1)));
  EXPECT_EQ(tier.Get(K(1)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.corruptions_detected(), 1);
  EXPECT_FALSE(tier.Contains(K(1)));
  ASSERT_TRUE(tier.Put(K(1), Bytes(64, 2)).ok());
  EXPECT_EQ(*tier.Get(K(1)), Bytes(64, 2));
}

TEST(DiskTierTest, WriteFailuresAreIoErrorsThatChangeNothing) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path() / "tier", 128);
  ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
  ASSERT_TRUE(tier.Put(K(2), Bytes(64, 2)).ok());
  // The temporary name is taken by a directory: the file cannot be created. The Put would have
  // evicted K(1); it must not have.
  const auto temp = std::filesystem::path(tier.PathOf(K(3)).string() + ".tmp");
  std::filesystem::create_directory(temp);
  Status s = tier.Put(K(3), Bytes(64, 3));
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(temp.string()), std::string::npos);
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(1), K(2)}));
  EXPECT_EQ(tier.used_bytes(), 128);
  EXPECT_EQ(*tier.Get(K(1)), Bytes(64, 1));
  std::filesystem::remove(temp);

  // The entry's own name is a non-empty directory: the rename fails.
  std::filesystem::create_directories(tier.PathOf(K(3)) / "x");
  s = tier.Put(K(3), Bytes(64, 3));
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(tier.PathOf(K(3)).string()), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(2), K(1)}));
  std::filesystem::remove_all(tier.PathOf(K(3)));

  // The whole directory removed behind its back: writes fail, reads miss.
  std::filesystem::remove_all(tmp.path() / "tier");
  EXPECT_EQ(tier.Put(K(3), Bytes(64, 3)).code(), StatusCode::kIoError);
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(2), K(1)}));
  EXPECT_EQ(tier.Get(K(2)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.corruptions_detected(), 1);
  EXPECT_EQ(tier.LruOrder(), std::vector<PrefixKey>{K(1)});
}

}  // namespace
}  // namespace hkv
