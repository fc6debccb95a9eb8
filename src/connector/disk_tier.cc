#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
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
// Version 2 added the model identity; a version 1 file (which never outlived its process) is
// damaged to this reader.
constexpr uint32_t kVersion = 2;
// magic, version, key group, key digest (lo, hi), model (lo, hi), payload bytes, checksum
constexpr size_t kHeader = 64;
constexpr size_t kChecksumAt = 56;
constexpr std::string_view kSuffix = ".hkv";
constexpr std::string_view kTempSuffix = ".hkv.tmp";
constexpr std::string_view kLockName = "LOCK";
constexpr std::string_view kLabelName = "MODEL";
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
  int release() { return std::exchange(fd_, -1); }
  // Closes now, so a failed close (a late write error on some file systems) can be reported.
  bool Close() { return ::close(release()) == 0; }

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

// The key an entry file's name (<32 hex>-<8 hex> and `suffix`) names.
std::optional<PrefixKey> KeyOfName(std::string_view name, std::string_view suffix) {
  if (name.size() != kStemLength + suffix.size() || !name.ends_with(suffix) || name[32] != '-' ||
      !IsHex(name.substr(0, 32)) || !IsHex(name.substr(33, 8))) {
    return std::nullopt;
  }
  const ModelIdentity digest = ModelIdentity::FromHex(name.substr(0, 32)).value();
  uint32_t group = 0;
  for (char c : name.substr(33, 8))
    group = (group << 4) | static_cast<uint32_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  return PrefixKey{BlockHash{digest.lo, digest.hi}, static_cast<int32_t>(group)};
}

void RemoveQuietly(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

void EncodeHeader(unsigned char* h, const PrefixKey& key, const ModelIdentity& model,
                  std::span<const unsigned char> payload) {
  Put64(h, kMagic);
  Put32(h + 8, kVersion);
  Put32(h + 12, static_cast<uint32_t>(key.group));
  Put64(h + 16, key.hash.lo);
  Put64(h + 24, key.hash.hi);
  Put64(h + 32, model.lo);
  Put64(h + 40, model.hi);
  Put64(h + 48, payload.size());
  Put64(h + kChecksumAt, connector_format::SeededChecksum({h, kChecksumAt}, payload));
}

enum class Verdict { kOk, kDamaged, kForeign };

// Checks a header read from a file of `file_bytes` bytes that should hold `key` of `model`;
// the payload length it declares in `payload_bytes`.
Verdict CheckHeader(const unsigned char* h, uint64_t file_bytes, const PrefixKey& key,
                    const ModelIdentity& model, const std::filesystem::path& path,
                    uint64_t& payload_bytes, std::string& why) {
  if (Get64(h) != kMagic) {
    why = fmt::format("{} is not a disk tier file (its magic is wrong)", path.string());
    return Verdict::kDamaged;
  }
  if (Get32(h + 8) != kVersion) {
    why = fmt::format("{} is a version {} disk tier file; expected version {}", path.string(),
                      Get32(h + 8), kVersion);
    return Verdict::kDamaged;
  }
  if (Get64(h + 32) != model.lo || Get64(h + 40) != model.hi) {
    why = fmt::format("{} holds an entry of model {:016x}{:016x}, not of {}", path.string(),
                      Get64(h + 40), Get64(h + 32), model.Hex());
    return Verdict::kForeign;
  }
  if (Get32(h + 12) != static_cast<uint32_t>(key.group) || Get64(h + 16) != key.hash.lo ||
      Get64(h + 24) != key.hash.hi) {
    why = fmt::format("{} holds another key's entry", path.string());
    return Verdict::kDamaged;
  }
  payload_bytes = Get64(h + 48);
  if (file_bytes < kHeader || file_bytes - kHeader != payload_bytes) {
    why = fmt::format("{} has {} bytes; its header says {} + {}", path.string(), file_bytes,
                      kHeader, payload_bytes);
    return Verdict::kDamaged;
  }
  return Verdict::kOk;
}

// Takes the model directory's lock without waiting; the descriptor holding it, or why not.
Result<int> TakeLock(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / kLockName;
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    return Status::IoError(
        fmt::format("disk tier: cannot open the lock file {}: {}", path.string(), Errno()));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return Status::IoError(fmt::format("disk tier: cannot lock {}: {}", path.string(), Errno()));
    }
    char pid[32] = {};
    const ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    return Status::FailedPrecondition(fmt::format(
        "disk tier: {} is in use by another process (pid {}); one process per model directory",
        model_dir.string(), n > 0 ? std::string(pid, static_cast<size_t>(n)) : "unknown"));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::IoError(
        fmt::format("disk tier: cannot write the lock file {}: {}", path.string(), Errno()));
  }
  return fd.release();
}

Status ListFiles(const std::filesystem::path& dir, std::vector<std::filesystem::path>& out) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path());
  if (ec) {
    return Status::IoError(
        fmt::format("disk tier: cannot list directory {}: {}", dir.string(), ec.message()));
  }
  return Status::Ok();
}

}  // namespace

Result<DiskTier> DiskTier::Open(const std::filesystem::path& dir, const DiskTierOptions& options) {
  if (options.capacity_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("disk tier: capacity {} bytes is negative", options.capacity_bytes));
  }
  if (options.model == ModelIdentity{}) {
    return Status::InvalidArgument(
        "disk tier: no model identity (ComputeModelIdentity): entries of different models must "
        "not share a name");
  }
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
    return Status::InvalidArgument(
        fmt::format("disk tier: {} exists and is not a directory", dir.string()));
  }
  const std::filesystem::path model_dir = dir / options.model.Hex();
  std::filesystem::create_directories(model_dir, ec);
  if (ec) {
    return Status::IoError(
        fmt::format("disk tier: cannot create directory {}: {}", model_dir.string(), ec.message()));
  }
  HKV_ASSIGN_OR_RETURN(const int lock_fd, TakeLock(model_dir));
  DiskTier tier(model_dir, options, lock_fd);
  HKV_RETURN_IF_ERROR(tier.Recover());
  if (!options.label.empty()) {
    // Informational (List shows it): a failure to write it costs nothing else.
    std::ofstream(model_dir / kLabelName, std::ios::trunc) << options.label << "\n";
  }
  return tier;
}

DiskTier::~DiskTier() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

DiskTier::DiskTier(DiskTier&& other) noexcept
    : IndexedTier(std::move(other)),
      dir_(std::move(other.dir_)),
      options_(std::move(other.options_)),
      lock_fd_(std::exchange(other.lock_fd_, -1)),
      corruptions_(other.corruptions_),
      last_stamp_(other.last_stamp_),
      open_stats_(other.open_stats_) {}

DiskTier& DiskTier::operator=(DiskTier&& other) noexcept {
  if (this == &other) return *this;
  if (lock_fd_ >= 0) ::close(lock_fd_);
  IndexedTier::operator=(std::move(other));
  dir_ = std::move(other.dir_);
  options_ = std::move(other.options_);
  lock_fd_ = std::exchange(other.lock_fd_, -1);
  corruptions_ = other.corruptions_;
  last_stamp_ = other.last_stamp_;
  open_stats_ = other.open_stats_;
  return *this;
}

Status DiskTier::Recover() {
  struct Found {
    PrefixKey key;
    int64_t bytes = 0;
    int64_t stamp = 0;  // modification time, ns
    std::string name;
  };
  std::vector<std::filesystem::path> files;
  HKV_RETURN_IF_ERROR(ListFiles(dir_, files));
  std::vector<Found> found;
  std::vector<unsigned char> payload;
  for (const std::filesystem::path& path : files) {
    const std::string name = path.filename().string();
    if (KeyOfName(name, kTempSuffix)) {
      RemoveQuietly(path);
      ++open_stats_.partial_removed;
      continue;
    }
    const std::optional<PrefixKey> key = KeyOfName(name, kSuffix);
    if (!key) continue;  // not ours (LOCK, MODEL, an operator's notes)
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat fs {};
    unsigned char header[kHeader];
    uint64_t payload_bytes = 0;
    std::string why;
    Verdict v = Verdict::kDamaged;
    if (fd.get() >= 0 && ::fstat(fd.get(), &fs) == 0 && ReadAll(fd.get(), header, kHeader)) {
      v = CheckHeader(header, static_cast<uint64_t>(fs.st_size), *key, options_.model, path,
                      payload_bytes, why);
    }
    if (v == Verdict::kOk && options_.check_payloads_on_open) {
      payload.resize(payload_bytes);
      if (!ReadAll(fd.get(), payload.data(), payload.size()) ||
          connector_format::SeededChecksum({header, kChecksumAt}, payload) !=
              Get64(header + kChecksumAt)) {
        v = Verdict::kDamaged;
      }
    }
    if (v != Verdict::kOk) {
      RemoveQuietly(path);
      ++(v == Verdict::kForeign ? open_stats_.foreign_removed : open_stats_.damaged_removed);
      continue;
    }
    found.push_back({*key, static_cast<int64_t>(payload_bytes),
                     int64_t{fs.st_mtim.tv_sec} * 1'000'000'000 + fs.st_mtim.tv_nsec, name});
  }
  // Oldest first: the order the index keeps, so eviction resumes where the last process left it.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.stamp != b.stamp ? a.stamp < b.stamp : a.name < b.name;
  });
  for (const Found& f : found)
    last_stamp_ = std::max(last_stamp_, f.stamp);
  int64_t total = 0;
  for (const Found& f : found)
    total += f.bytes;
  for (const Found& f : found) {
    if (total > index_.capacity_bytes()) {
      RemoveQuietly(dir_ / f.name);
      total -= f.bytes;
      ++open_stats_.over_budget_removed;
      continue;
    }
    index_.Insert(f.key, f.bytes);
    ++open_stats_.entries_loaded;
    open_stats_.bytes_loaded += f.bytes;
  }
  return Status::Ok();
}

bool DiskTier::Stamp(int fd) const {
  // File times come from a coarse clock (a few milliseconds): entries written in a burst would
  // tie and lose their order. Explicit stamps, strictly increasing, keep it exactly.
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t ns = std::max(int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec, last_stamp_ + 1);
  last_stamp_ = ns;
  const timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  const timespec times[2] = {t, t};
  return ::futimens(fd, times) == 0;
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
  EncodeHeader(header, key, options_.model, bytes);

  // The entry is written in full under a temporary name before it takes its own, so a crash
  // leaves a complete entry file or none (Open removes the temporary).
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
        !Stamp(fd.get()) || (options_.fsync && ::fsync(fd.get()) != 0) || !fd.Close()) {
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
  if (options_.fsync) {
    // The rename is durable only once the directory is.
    Fd d(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.get() < 0 || ::fsync(d.get()) != 0) {
      const std::string why = Errno();
      RemoveQuietly(path);
      return Status::IoError(
          fmt::format("disk tier: cannot sync directory {}: {}", dir_.string(), why));
    }
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
  uint64_t payload_bytes = 0;
  std::string why;
  if (CheckHeader(header, static_cast<uint64_t>(st.st_size), key, options_.model, path,
                  payload_bytes, why) != Verdict::kOk) {
    return Status::IoError(why);
  }
  if (connector_format::SeededChecksum({header, kChecksumAt}, bytes) !=
      Get64(header + kChecksumAt)) {
    return Status::IoError(fmt::format("{} fails its checksum", path.string()));
  }
  // Recency for the next process's Open; a file whose time cannot be set only looks older.
  Stamp(fd.get());
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

Result<std::vector<DiskTierModel>> DiskTier::List(const std::filesystem::path& dir) {
  std::vector<DiskTierModel> models;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return models;
  std::vector<std::filesystem::path> subdirs;
  HKV_RETURN_IF_ERROR(ListFiles(dir, subdirs));
  std::sort(subdirs.begin(), subdirs.end());
  for (const std::filesystem::path& sub : subdirs) {
    Result<ModelIdentity> model = ModelIdentity::FromHex(sub.filename().string());
    if (!model.ok() || !std::filesystem::is_directory(sub, ec)) continue;
    DiskTierModel m;
    m.model = *model;
    std::ifstream label(sub / kLabelName);
    std::getline(label, m.label);
    std::vector<std::filesystem::path> files;
    HKV_RETURN_IF_ERROR(ListFiles(sub, files));
    for (const auto& f : files) {
      if (!KeyOfName(f.filename().string(), kSuffix)) continue;
      ++m.entries;
      m.bytes += static_cast<int64_t>(std::filesystem::file_size(f, ec));
    }
    Result<int> lock = TakeLock(sub);
    m.in_use = !lock.ok() && lock.status().code() == StatusCode::kFailedPrecondition;
    if (lock.ok()) ::close(*lock);
    models.push_back(std::move(m));
  }
  return models;
}

Status DiskTier::Drop(const std::filesystem::path& dir, const ModelIdentity& model) {
  const std::filesystem::path sub = dir / model.Hex();
  std::error_code ec;
  if (!std::filesystem::is_directory(sub, ec)) {
    return Status::NotFound(
        fmt::format("disk tier: {} holds no entries of model {}", dir.string(), model.Hex()));
  }
  HKV_ASSIGN_OR_RETURN(const int lock_fd, TakeLock(sub));
  Fd lock(lock_fd);
  std::filesystem::remove_all(sub, ec);
  if (ec) {
    return Status::IoError(
        fmt::format("disk tier: cannot remove {}: {}", sub.string(), ec.message()));
  }
  return Status::Ok();
}

}  // namespace hkv
