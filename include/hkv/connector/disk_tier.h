// DiskTier: the Tier on a local disk - one file per entry, kept across process restarts, one
// directory per model.
//
// Contract: as Tier (hkv/connector/tier.h); capacity counts the stored bytes (payloads), not the
// 64-byte header of each file.
// - Layout: Open(dir, options) keeps the entries of `options.model` in dir/<model hex>/, so one
//   directory serves many models and a different model never sees another's entries. Each file
//   also names its model, key and length in its header, checked on every read: a file copied
//   into the wrong model's directory is foreign, never a hit.
// - Restarts: Open rebuilds the index from the files it finds. Each entry file's header and size
//   are checked (its payload checksum too with `check_payloads_on_open`; otherwise the Get that
//   reads it checks it, as always); damaged, foreign and partial files (temporaries of a write cut
//   short) are removed and counted in open_stats(). Recency survives a restart through the files'
//   modification times (Put and Get set them, strictly increasing), so LRU order carries over
//   exactly; entries beyond
//   `capacity_bytes` are evicted at Open, oldest first. Pins do not survive: they belong to the
//   process that held them.
// - One process per model directory: Open takes an exclusive lock (flock on dir/<model>/LOCK,
//   released by the kernel when the holder dies, even by kill -9); a second Open of the same
//   model's directory, from this or another process, is refused with FailedPrecondition naming
//   the directory and the holder's pid. Different models share a directory concurrently.
// - Crash safety: a Put writes a temporary file and renames it to the entry's name, so an entry
//   file is complete or absent after a process crash. With `fsync` the file is synced before the
//   rename and the directory after it, so a completed Put also survives a power loss; without it
//   (the default, for speed) a power loss can leave an entry file short or zero-filled, which Open
//   (size) or the Get (checksum) finds and drops - never wrong bytes, only lost entries.
// - A Get reads the file and checks its header (magic, version, model, key, length) against the
//   index, its size and its checksum. A file that is missing, unreadable, truncated, padded or
//   corrupt is a miss (NotFound saying what was wrong): the entry is removed - pinned or not, its
//   bytes are gone - its file deleted and corruptions_detected() counts it. Never wrong bytes.
// - Contains, Pin, Unpin and LruOrder answer from the index without touching the disk. Files of
//   evicted entries are removed as a best effort: one that cannot be is never read again (not
//   indexed) and goes at the next Open, which finds it over budget or in the index again.
// - List and Drop are for operators: which models a directory holds (entries, bytes, whether a
//   process has them open), and removing one model's entries (refused while a process holds it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <hkv/connector/model_identity.h>
#include <hkv/connector/tier_index.h>

namespace hkv {

struct DiskTierOptions {
  int64_t capacity_bytes = int64_t{1} << 30;
  ModelIdentity model;
  // Shown by List (e.g. the model's name); written to dir/<model>/MODEL at Open.
  std::string label;
  bool fsync = false;
  bool check_payloads_on_open = false;
};

// What Open found in the model's directory.
struct DiskTierOpenStats {
  int64_t entries_loaded = 0;
  int64_t bytes_loaded = 0;
  int64_t damaged_removed = 0;  // wrong magic, version, length, name or checksum
  int64_t foreign_removed = 0;  // another model's entry
  int64_t partial_removed = 0;  // temporaries of writes that never finished
  int64_t over_budget_removed = 0;
};

// One model's entries in a disk tier directory, as List sees them.
struct DiskTierModel {
  ModelIdentity model;
  std::string label;
  int64_t entries = 0;
  int64_t bytes = 0;  // file sizes, headers included
  bool in_use = false;
};

class DiskTier final : public IndexedTier {
 public:
  static Result<DiskTier> Open(const std::filesystem::path& dir, const DiskTierOptions& options);
  ~DiskTier() override;
  DiskTier(DiskTier&& other) noexcept;
  DiskTier& operator=(DiskTier&& other) noexcept;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;
  std::string_view medium() const override { return "DISK"; }

  // The model's directory, dir/<model hex>.
  const std::filesystem::path& dir() const { return dir_; }
  const ModelIdentity& model() const { return options_.model; }
  // The file that holds (or would hold) `key`: hex of the digest and the group.
  std::filesystem::path PathOf(const PrefixKey& key) const;
  // Entries lost to damaged or missing files, found by Get.
  int64_t corruptions_detected() const { return corruptions_; }
  const DiskTierOpenStats& open_stats() const { return open_stats_; }

  // The models under `dir`, by hex; a missing directory holds none.
  static Result<std::vector<DiskTierModel>> List(const std::filesystem::path& dir);
  // Removes every file of `model` under `dir` and its directory; FailedPrecondition while a
  // process holds it open, NotFound when `dir` has no such model.
  static Status Drop(const std::filesystem::path& dir, const ModelIdentity& model);

 private:
  DiskTier(std::filesystem::path dir, const DiskTierOptions& options, int lock_fd)
      : IndexedTier("disk tier", options.capacity_bytes),
        dir_(std::move(dir)),
        options_(options),
        lock_fd_(lock_fd) {}
  // Indexes the entry files found at Open; removes what cannot be trusted.
  Status Recover();
  // Reads and checks the file of held `key`; the reason it cannot be trusted on failure.
  Result<std::vector<unsigned char>> Read(const PrefixKey& key) const;
  // Sets the file's times to a stamp later than every earlier one: its recency on disk.
  bool Stamp(int fd) const;

  std::filesystem::path dir_;
  DiskTierOptions options_;
  int lock_fd_ = -1;
  int64_t corruptions_ = 0;
  mutable int64_t last_stamp_ = 0;  // ns since the epoch
  DiskTierOpenStats open_stats_;
};

}  // namespace hkv
