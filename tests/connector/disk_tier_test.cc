// DiskTier beyond the Tier contract (tier_test.cc runs that): the directory it is given, restarts
// (entries, order, budget, torn and foreign files, a process killed mid-write), models sharing a
// directory, the one-owner lock, files damaged, shortened, deleted or made unreadable behind its
// back, and write failures.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hkv/connector/disk_tier.h>

#include "tier_test_util.h"

namespace hkv {
namespace {

using testing::Bytes;
using testing::K;

DiskTier MustOpen(const std::filesystem::path& dir, int64_t capacity, uint64_t model = 1) {
  Result<DiskTier> t = DiskTier::Open(dir, testing::DiskOptions(capacity, model));
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
  EXPECT_EQ(tier.PathOf(K(1)).parent_path(), dir / testing::TestModel().Hex());
  EXPECT_EQ(tier.dir(), dir / testing::TestModel().Hex());

  const auto file = tmp.path() / "plain_file";
  std::ofstream(file) << "not a directory";
  Result<DiskTier> refused = DiskTier::Open(file, testing::DiskOptions(100));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(file.string()), std::string::npos);
  // Nor can a directory be made below a file.
  EXPECT_FALSE(DiskTier::Open(file / "sub", testing::DiskOptions(100)).ok());

  // A tier without a model identity, or with a negative budget, is refused by name.
  DiskTierOptions anonymous = testing::DiskOptions(100);
  anonymous.model = ModelIdentity{};
  refused = DiskTier::Open(tmp.path() / "c", anonymous);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("no model identity"), std::string::npos);
  refused = DiskTier::Open(tmp.path() / "c", testing::DiskOptions(-1));
  EXPECT_NE(refused.status().message().find("capacity -1 bytes"), std::string::npos);
}

// A restart finds every entry with its bytes and its place in the LRU order; pins do not carry
// over; a budget smaller than what is on disk evicts the oldest at Open.
TEST(DiskTierTest, ReopensWithItsEntriesInLruOrder) {
  testing::ScopedTempDir tmp;
  {
    DiskTier old = MustOpen(tmp.path(), 1000);
    for (uint64_t k = 1; k <= 4; ++k)
      ASSERT_TRUE(old.Put(K(k), Bytes(10 * k, static_cast<unsigned char>(k))).ok());
    ASSERT_TRUE(old.Get(K(1)).ok());  // K(1) becomes the most recent
    ASSERT_TRUE(old.Pin(K(2)).ok());
  }
  {
    DiskTier tier = MustOpen(tmp.path(), 1000);
    EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(2), K(3), K(4), K(1)}));
    EXPECT_EQ(tier.used_bytes(), 100);
    EXPECT_EQ(tier.open_stats().entries_loaded, 4);
    EXPECT_EQ(tier.open_stats().bytes_loaded, 100);
    for (uint64_t k = 1; k <= 4; ++k)
      EXPECT_EQ(*tier.Get(K(k)), Bytes(10 * k, static_cast<unsigned char>(k)));
    EXPECT_TRUE(tier.Evict(K(2)).ok());  // its pin belonged to the old process
  }
  // Order now K3 K4 K1... each Get above touched in key order: K(1) K(3) K(4) remain, oldest K(1).
  DiskTier small = MustOpen(tmp.path(), 75);
  EXPECT_EQ(small.open_stats().over_budget_removed, 1);
  EXPECT_EQ(small.LruOrder(), (std::vector<PrefixKey>{K(3), K(4)}));
  EXPECT_FALSE(std::filesystem::exists(small.PathOf(K(1))));
  EXPECT_EQ(small.used_bytes(), 70);
}

// What a crash or an intruder leaves: a temporary of a write cut short, a truncated entry, one
// that claims another name, another model's entry copied in, a file from an older format. Open
// removes each (counting which), keeps the good ones and leaves files that are not its own.
TEST(DiskTierTest, OpenDropsTornDamagedAndForeignFiles) {
  testing::ScopedTempDir tmp;
  std::filesystem::path model2_file;
  {
    DiskTier other = MustOpen(tmp.path(), 1000, /*model=*/2);
    ASSERT_TRUE(other.Put(K(7), Bytes(64, 7)).ok());
    model2_file = other.PathOf(K(7));
  }
  std::filesystem::path dir;
  {
    DiskTier tier = MustOpen(tmp.path(), 1000);
    for (uint64_t k = 1; k <= 4; ++k)
      ASSERT_TRUE(tier.Put(K(k), Bytes(64, static_cast<unsigned char>(k))).ok());
    dir = tier.dir();
    testing::DamageFile(tier.PathOf(K(2)), testing::Damage::kTruncate, 70);
    std::filesystem::copy_file(tier.PathOf(K(4)), tier.PathOf(K(5)));
    std::filesystem::copy_file(model2_file, tier.PathOf(K(7)));
    std::ofstream(tier.PathOf(K(6)).string() + ".tmp") << "a write cut short";
    std::ofstream(dir / "notes.txt") << "someone else's";
  }
  DiskTier tier = MustOpen(tmp.path(), 1000);
  const DiskTierOpenStats& s = tier.open_stats();
  EXPECT_EQ(s.entries_loaded, 3);
  EXPECT_EQ(s.damaged_removed, 2);  // truncated K(2), K(5) holding K(4)'s header
  EXPECT_EQ(s.foreign_removed, 1);
  EXPECT_EQ(s.partial_removed, 1);
  EXPECT_EQ(tier.LruOrder(), (std::vector<PrefixKey>{K(1), K(3), K(4)}));
  for (uint64_t k : {2, 5, 7})
    EXPECT_FALSE(std::filesystem::exists(tier.PathOf(K(k)))) << k;
  EXPECT_FALSE(std::filesystem::exists(tier.PathOf(K(6)).string() + ".tmp"));
  EXPECT_TRUE(std::filesystem::exists(dir / "notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(model2_file));  // model 2's own directory is untouched
}

// A flipped payload byte passes the header and size checks at Open; the Get that reads it finds
// it. With check_payloads_on_open, Open finds it first.
TEST(DiskTierTest, PayloadDamageIsFoundByTheGetOrByACheckingOpen) {
  testing::ScopedTempDir tmp;
  std::filesystem::path file;
  {
    DiskTier tier = MustOpen(tmp.path(), 1000);
    ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
    ASSERT_TRUE(tier.Put(K(2), Bytes(64, 2)).ok());
    file = tier.PathOf(K(1));
  }
  testing::DamageFile(file, testing::Damage::kFlipByte, 100);
  {
    DiskTier tier = MustOpen(tmp.path(), 1000);
    EXPECT_EQ(tier.open_stats().entries_loaded, 2);
    EXPECT_EQ(tier.Get(K(1)).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(tier.corruptions_detected(), 1);
    ASSERT_TRUE(tier.Put(K(1), Bytes(64, 1)).ok());
  }
  testing::DamageFile(file, testing::Damage::kFlipByte, 100);
  DiskTierOptions checking = testing::DiskOptions(1000);
  checking.check_payloads_on_open = true;
  DiskTier tier = DiskTier::Open(tmp.path(), checking).value();
  EXPECT_EQ(tier.open_stats().damaged_removed, 1);
  EXPECT_EQ(tier.LruOrder(), std::vector<PrefixKey>{K(2)});
}

// Same directory, two models: neither sees the other's entries, both can be open at once, and
// List and Drop act on one of them.
TEST(DiskTierTest, ModelsShareADirectoryButNotEntries) {
  testing::ScopedTempDir tmp;
  DiskTierOptions a_options = testing::DiskOptions(1000, 1);
  a_options.label = "model a";
  std::optional<DiskTier> a(DiskTier::Open(tmp.path(), a_options).value());
  DiskTier b = MustOpen(tmp.path(), 1000, 2);
  ASSERT_TRUE(a->Put(K(1), Bytes(64, 1)).ok());
  ASSERT_TRUE(a->Put(K(2), Bytes(64, 1)).ok());
  EXPECT_FALSE(b.Contains(K(1)));
  EXPECT_EQ(b.Get(K(1)).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(b.Put(K(1), Bytes(64, 2)).ok());
  EXPECT_EQ(*a->Get(K(1)), Bytes(64, 1));
  EXPECT_EQ(*b.Get(K(1)), Bytes(64, 2));

  std::vector<DiskTierModel> models = DiskTier::List(tmp.path()).value();
  ASSERT_EQ(models.size(), 2u);
  const auto find = [&](const ModelIdentity& m) {
    for (const DiskTierModel& d : models)
      if (d.model == m) return d;
    ADD_FAILURE() << "no model " << m.Hex();
    return DiskTierModel{};
  };
  EXPECT_EQ(find(testing::TestModel(1)).entries, 2);
  EXPECT_EQ(find(testing::TestModel(1)).bytes, 2 * (64 + 64));
  EXPECT_EQ(find(testing::TestModel(1)).label, "model a");
  EXPECT_TRUE(find(testing::TestModel(1)).in_use);
  EXPECT_EQ(find(testing::TestModel(2)).entries, 1);

  const Status busy = DiskTier::Drop(tmp.path(), testing::TestModel(1));
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("in use"), std::string::npos) << busy.message();
  a.reset();
  models = DiskTier::List(tmp.path()).value();
  EXPECT_FALSE(find(testing::TestModel(1)).in_use);
  ASSERT_TRUE(DiskTier::Drop(tmp.path(), testing::TestModel(1)).ok());
  EXPECT_EQ(DiskTier::Drop(tmp.path(), testing::TestModel(1)).code(), StatusCode::kNotFound);
  models = DiskTier::List(tmp.path()).value();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].model, testing::TestModel(2));
  EXPECT_EQ(MustOpen(tmp.path(), 1000, 1).LruOrder().size(), 0u);
  EXPECT_EQ(*b.Get(K(1)), Bytes(64, 2));
}

// One model's directory has one owner: a second Open, in this process or another, is refused
// naming the directory and the holder; the kernel frees the lock when the holder dies, even by
// SIGKILL, and the next Open finds what the dead process had stored.
TEST(DiskTierTest, OneProcessPerModelDirectory) {
  testing::ScopedTempDir tmp;
  {
    DiskTier first = MustOpen(tmp.path(), 1000);
    const Result<DiskTier> second = DiskTier::Open(tmp.path(), testing::DiskOptions(1000));
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find(first.dir().string()), std::string::npos);
    EXPECT_NE(second.status().message().find(std::to_string(::getpid())), std::string::npos);
  }
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    Result<DiskTier> t = DiskTier::Open(tmp.path(), testing::DiskOptions(1000));
    const bool ok = t.ok() && t->Put(K(1), Bytes(64, 9)).ok();
    const char c = ok ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    for (;;)
      ::pause();  // holds the tier until killed
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(c, 'y');
  const Result<DiskTier> refused = DiskTier::Open(tmp.path(), testing::DiskOptions(1000));
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(child)), std::string::npos)
      << refused.status().message();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  DiskTier after = MustOpen(tmp.path(), 1000);
  EXPECT_EQ(*after.Get(K(1)), Bytes(64, 9));
}

// A process killed with SIGKILL while it writes large entries: the next Open has every entry
// whose Put had returned, byte for byte, at most the one being written besides (renamed just
// before the kill), and no torn one; a temporary left behind is counted and removed.
TEST(DiskTierTest, KilledMidWriteLosesOnlyTheUnfinishedEntry) {
  testing::ScopedTempDir tmp;
  constexpr size_t kEntry = size_t{4} << 20;
  const auto fill = [](uint64_t k) { return static_cast<unsigned char>(k * 37 + 1); };
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(done[0]);
    Result<DiskTier> t = DiskTier::Open(tmp.path(), testing::DiskOptions(int64_t{1} << 30));
    if (!t.ok()) ::_exit(1);
    for (uint64_t k = 1;; ++k) {
      if (!t->Put(K(k), Bytes(kEntry, fill(k))).ok()) ::_exit(1);
      const uint64_t n = k;
      if (::write(done[1], &n, sizeof n) != sizeof n) ::_exit(1);
    }
  }
  ::close(done[1]);
  uint64_t reported = 0;
  while (reported < 6) {
    ASSERT_EQ(::read(done[0], &reported, sizeof reported), static_cast<ssize_t>(sizeof reported));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  // Entries finished after `reported` was read but before the kill are complete too.
  uint64_t n = 0;
  while (::read(done[0], &n, sizeof n) == static_cast<ssize_t>(sizeof n))
    reported = n;
  ::close(done[0]);

  DiskTier tier = MustOpen(tmp.path(), int64_t{1} << 30);
  const std::vector<PrefixKey> held = tier.LruOrder();
  ASSERT_GE(held.size(), reported);
  ASSERT_LE(held.size(), reported + 1);
  EXPECT_EQ(tier.open_stats().damaged_removed, 0);
  EXPECT_LE(tier.open_stats().partial_removed, 1);
  for (uint64_t k = 1; k <= held.size(); ++k) {
    EXPECT_EQ(held[k - 1], K(k));
    const Result<std::vector<unsigned char>> got = tier.Get(K(k));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, Bytes(kEntry, fill(k))) << k;
  }
  EXPECT_EQ(tier.corruptions_detected(), 0);
}

// With fsync the contract is the same (the sync only adds durability against power loss).
TEST(DiskTierTest, FsyncWritesReadBack) {
  testing::ScopedTempDir tmp;
  DiskTierOptions o = testing::DiskOptions(1000);
  o.fsync = true;
  {
    DiskTier tier = DiskTier::Open(tmp.path(), o).value();
    ASSERT_TRUE(tier.Put(K(1), Bytes(64, 3)).ok());
  }
  DiskTier tier = DiskTier::Open(tmp.path(), o).value();
  EXPECT_EQ(*tier.Get(K(1)), Bytes(64, 3));
}

// Each damage: the Get misses (never other bytes), the entry and its file go, the counter
// counts it, and the key can be stored again.
TEST(DiskTierTest, DamagedFilesAreMissesAndForgotten) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 10000);
  int64_t expected = 0;
  for (testing::Damage d : testing::kDamages) {
    // Flips: every byte of the 64 + 64 byte file (37 is prime to 128, so at * 37 visits each).
    for (uint64_t at = 0; at < (d == testing::Damage::kFlipByte ? 128u : 3u); ++at) {
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

// A header field damaged: the miss names that field (magic, version, key, model or length; the
// checksum covers the rest).
TEST(DiskTierTest, EachDamagedHeaderFieldIsNamed) {
  testing::ScopedTempDir tmp;
  DiskTier tier = MustOpen(tmp.path(), 1000);
  const std::pair<uint64_t, std::string> fields[] = {
      {0, "is not a disk tier file"},    {8, "is a version 34 disk tier file"},
      {12, "holds another key's entry"}, {16, "holds another key's entry"},
      {32, "holds an entry of model"},   {48, "its header says 64 + 96"}};
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
