// DiskTier: the Tier on a local disk - one file per entry in a directory, beside a TierIndex.
//
// Contract: as Tier (hkv/connector/tier.h); capacity counts the stored bytes (payloads), not the
// 48-byte header of each file. Open creates the directory if missing and refuses a path that is
// not a directory, naming it; it then removes the entry and temporary files an earlier DiskTier
// left there (recognised by name; other files are left alone), because LRU order and pins are
// not on disk and an old file cannot be told from a stale one: the tier starts empty. One
// DiskTier per directory.
// - A Put writes a temporary file and renames it to the entry's name (PathOf), so an entry file
//   is never half written; an I/O error is an IoError naming the path, with the tier unchanged.
// - A Get reads the file and checks its header (magic, version, key, length) against the index,
//   its size and its checksum. A file that is missing, unreadable, truncated, padded or corrupt
//   is a miss (NotFound saying what was wrong): the entry is removed - pinned or not, its bytes
//   are gone - its file deleted and corruptions_detected() counts it. Never wrong bytes.
// - Contains, Pin, Unpin and LruOrder answer from the index without touching the disk, so damage
//   is found by the Get that reads it. Files of evicted entries are removed as a best effort: one
//   that cannot be is never read again (not indexed) and goes at the next Open.
#pragma once

#include <filesystem>

#include <hkv/connector/tier_index.h>

namespace hkv {

class DiskTier final : public IndexedTier {
 public:
  static Result<DiskTier> Open(const std::filesystem::path& dir, int64_t capacity_bytes);

  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;

  const std::filesystem::path& dir() const { return dir_; }
  // The file that holds (or would hold) `key`: hex of the digest and the group.
  std::filesystem::path PathOf(const PrefixKey& key) const;
  // Entries lost to damaged or missing files, found by Get.
  int64_t corruptions_detected() const { return corruptions_; }

 private:
  DiskTier(std::filesystem::path dir, int64_t capacity_bytes)
      : IndexedTier("disk tier", capacity_bytes), dir_(std::move(dir)) {}
  // Reads and checks the file of held `key`; the reason it cannot be trusted on failure.
  Result<std::vector<unsigned char>> Read(const PrefixKey& key) const;

  std::filesystem::path dir_;
  int64_t corruptions_ = 0;
};

}  // namespace hkv
