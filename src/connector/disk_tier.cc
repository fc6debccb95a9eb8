#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hkv/connector/disk_tier.h>

#include "checked_format.h"

namespace hkv {
namespace {

using connector_format::Get32;
using connector_format::Get64;
using connector_format::Put32;
using connector_format::Put64;

// "hkvtier" and a zero byte, read as a little-endian integer.
constexpr uint64_t kMagic = 0x0072656974766b68ull;
constexpr uint32_t kVersion = 1;
// magic, version, key group, key digest (lo, hi), payload bytes, checksum
constexpr size_t kHeader = 48;
constexpr size_t kChecksumAt = 40;
constexpr std::string_view kSuffix = ".hkv";
constexpr std::string_view kTempSuffix = ".hkv.tmp";
// 32 hex digits of the digest, '-', 8 of the group.
constexpr size_t kStemLength = 41;

std::string Errno() {
  return std::strerror(errno);
}

// Closes the descriptor on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, so a failed close (a late write error on some file systems) can be reported.
  bool Close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

bool WriteAll(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on an error or an early end of file (errno 0 then).
bool ReadAll(int fd, unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool IsHex(std::string_view s) {
  return s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Whether `name` is one this tier writes: <32 hex>-<8 hex>.hkv or .hkv.tmp.
bool IsTierFile(std::string_view name) {
  for (std::string_view suffix : {kSuffix, kTempSuffix}) {
    if (name.size() == kStemLength + suffix.size() && name.ends_with(suffix) && name[32] == '-' &&
        IsHex(name.substr(0, 32)) && IsHex(name.substr(33, 8))) {
      return true;
    }
  }
  return false;
}

void RemoveQuietly(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

}  // namespace

Result<DiskTier> DiskTier::Open(const std::filesystem::path& dir, int64_t capacity_bytes) {
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
    return Status::InvalidArgument(
        fmt::format("disk tier: {} exists and is not a directory", dir.string()));
  }
  if (!std::filesystem::exists(st)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return Status::IoError(
          fmt::format("disk tier: cannot create directory {}: {}", dir.string(), ec.message()));
    }
  }
  // Collect first: removing while iterating leaves the iteration unspecified.
  std::vector<std::filesystem::path> stale;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (IsTierFile(it->path().filename().string())) stale.push_back(it->path());
  }
  if (ec) {
    return Status::IoError(
        fmt::format("disk tier: cannot list directory {}: {}", dir.string(), ec.message()));
  }
  for (const auto& path : stale) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return Status::IoError(fmt::format("disk tier: cannot remove the old entry file {}: {}",
                                         path.string(), ec.message()));
    }
  }
  return DiskTier(dir, capacity_bytes);
}

std::filesystem::path DiskTier::PathOf(const PrefixKey& key) const {
  return dir_ / fmt::format("{:016x}{:016x}-{:08x}{}", key.hash.hi, key.hash.lo,
                            static_cast<uint32_t>(key.group), kSuffix);
}

Status DiskTier::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  if (index_.Contains(key)) {
    index_.Touch(key);
    return Status::Ok();
  }
  HKV_ASSIGN_OR_RETURN(const std::vector<PrefixKey> victims,
                       index_.Victims(key, static_cast<int64_t>(bytes.size())));
  unsigned char header[kHeader];
  Put64(header, kMagic);
  Put32(header + 8, kVersion);
  Put32(header + 12, static_cast<uint32_t>(key.group));
  Put64(header + 16, key.hash.lo);
  Put64(header + 24, key.hash.hi);
  Put64(header + 32, bytes.size());
  Put64(header + kChecksumAt, connector_format::SeededChecksum({header, kChecksumAt}, bytes));

  // The entry is written in full under a temporary name before it takes its own, so the index
  // and the files never disagree about a half-written entry. No fsync: Open starts empty, so a
  // crash cannot expose a file whose data did not reach the disk.
  const std::filesystem::path path = PathOf(key);
  const std::filesystem::path temp =
      path.string().substr(0, path.string().size() - kSuffix.size()).append(kTempSuffix);
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return Status::IoError(fmt::format("disk tier: cannot create {} for {}: {}", temp.string(),
                                         TierKeyName(key), Errno()));
    }
    if (!WriteAll(fd.get(), header, kHeader) || !WriteAll(fd.get(), bytes.data(), bytes.size()) ||
        !fd.Close()) {
      const std::string why = Errno();
      RemoveQuietly(temp);
      return Status::IoError(fmt::format("disk tier: cannot write {} for {}: {}", temp.string(),
                                         TierKeyName(key), why));
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = Errno();
    RemoveQuietly(temp);
    return Status::IoError(
        fmt::format("disk tier: cannot rename {} to {}: {}", temp.string(), path.string(), why));
  }
  // Evicted only once the new entry is safely written, so a failed write evicts nothing.
  for (const PrefixKey& v : victims) {
    index_.Erase(v);
    RemoveQuietly(PathOf(v));
  }
  index_.Insert(key, static_cast<int64_t>(bytes.size()));
  return Status::Ok();
}

Result<std::vector<unsigned char>> DiskTier::Read(const PrefixKey& key) const {
  const std::filesystem::path path = PathOf(key);
  const int64_t expected = index_.bytes(key);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0)
    return Status::IoError(fmt::format("cannot open {}: {}", path.string(), Errno()));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return Status::IoError(fmt::format("cannot stat {}: {}", path.string(), Errno()));
  }
  // The index knows the length, so a wrong size is caught before anything is read or allocated.
  if (static_cast<uint64_t>(st.st_size) != kHeader + static_cast<uint64_t>(expected)) {
    return Status::IoError(fmt::format("{} has {} bytes, the entry needs {}", path.string(),
                                       st.st_size, kHeader + static_cast<uint64_t>(expected)));
  }
  unsigned char header[kHeader];
  std::vector<unsigned char> bytes(static_cast<size_t>(expected));
  if (!ReadAll(fd.get(), header, kHeader) || !ReadAll(fd.get(), bytes.data(), bytes.size())) {
    return Status::IoError(
        fmt::format("cannot read {}: {}", path.string(), errno == 0 ? "ended early" : Errno()));
  }
  if (Get64(header) != kMagic) {
    return Status::IoError(
        fmt::format("{} is not a disk tier file (its magic is wrong)", path.string()));
  }
  if (Get32(header + 8) != kVersion) {
    return Status::IoError(fmt::format("{} is a version {} disk tier file; expected version {}",
                                       path.string(), Get32(header + 8), kVersion));
  }
  if (Get32(header + 12) != static_cast<uint32_t>(key.group) || Get64(header + 16) != key.hash.lo ||
      Get64(header + 24) != key.hash.hi) {
    return Status::IoError(fmt::format("{} holds another key's entry", path.string()));
  }
  if (Get64(header + 32) != bytes.size()) {
    return Status::IoError(fmt::format("{} says {} payload bytes, the entry has {}", path.string(),
                                       Get64(header + 32), bytes.size()));
  }
  if (connector_format::SeededChecksum({header, kChecksumAt}, bytes) !=
      Get64(header + kChecksumAt)) {
    return Status::IoError(fmt::format("{} fails its checksum", path.string()));
  }
  return bytes;
}

Result<std::vector<unsigned char>> DiskTier::Get(const PrefixKey& key) {
  if (!index_.Contains(key)) return index_.Miss(key);
  Result<std::vector<unsigned char>> bytes = Read(key);
  if (!bytes.ok()) {
    // The bytes are lost whatever the reason; dropping the entry lets a later Put store them anew.
    index_.Erase(key);
    RemoveQuietly(PathOf(key));
    ++corruptions_;
    return Status::NotFound(
        fmt::format("disk tier: entry {} lost: {}", TierKeyName(key), bytes.status().message()));
  }
  index_.Touch(key);
  return bytes;
}

Status DiskTier::Evict(const PrefixKey& key) {
  if (Status s = index_.CheckEvict(key); !s.ok()) return s;
  index_.Erase(key);
  RemoveQuietly(PathOf(key));
  return Status::Ok();
}

}  // namespace hkv
