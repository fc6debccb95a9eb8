// Tier streams: entries written as they are published, read in by a thread as they arrive.
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hkv/connector/tier_stream.h>
#include <hkv/connector/tier_transfer.h>

#include "transfer_format.h"

namespace hkv {
namespace {

using connector_format::EntryHeader;
using connector_format::Get32;
using connector_format::Get64;
using connector_format::HeaderSeed;
using connector_format::kEntryBytes;
using connector_format::Put32;
using connector_format::Put64;

constexpr uint32_t kMagic = 0x534b4846;  // "FHKS"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;  // magic, version, reserved, checksum of the 16 before

}  // namespace

TierStreamSender::TierStreamSender(int fd) : IndexedTier("tier stream", INT64_MAX), fd_(fd) {}

Result<std::unique_ptr<TierStreamSender>> TierStreamSender::Open(int fd) {
  unsigned char h[kHeaderBytes] = {};
  Put32(h, kMagic);
  Put32(h + 4, kVersion);
  Put64(h + 16, HeaderSeed({h, 16}));
  HKV_RETURN_IF_ERROR(SendAll(fd, h));
  return std::unique_ptr<TierStreamSender>(new TierStreamSender(fd));
}

Status TierStreamSender::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  HKV_RETURN_IF_ERROR(failed_);
  if (index_.Contains(key)) return Status::Ok();  // sent already
  unsigned char h[kEntryBytes];
  connector_format::PutEntryHeader(h, {key, 0, bytes.size()});
  if (Status s = SendAll(fd_, h); !s.ok()) return failed_ = s;
  if (Status s = SendAll(fd_, bytes); !s.ok()) return failed_ = s;
  index_.Insert(key, static_cast<int64_t>(bytes.size()));
  ++sent_;
  return Status::Ok();
}

Result<std::vector<unsigned char>> TierStreamSender::Get(const PrefixKey& key) {
  return Status::NotFound(
      fmt::format("tier stream: {} was sent; a sender keeps no bytes", TierKeyName(key)));
}

Status TierStreamSender::Evict(const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(index_.CheckEvict(key));
  index_.Erase(key);  // sent is sent: only forgotten here
  return Status::Ok();
}

Status TierStreamSender::Finish() {
  HKV_RETURN_IF_ERROR(failed_);
  unsigned char h[kEntryBytes];
  connector_format::PutEntryHeader(h, {PrefixKey{}, connector_format::kEndOfStream, 0});
  if (Status s = SendAll(fd_, h); !s.ok()) return failed_ = s;
  return Status::Ok();
}

TierStreamReceiver::TierStreamReceiver(int fd, int64_t capacity_bytes, int64_t max_entry_bytes)
    : fd_(fd), max_entry_bytes_(max_entry_bytes), inbox_(capacity_bytes) {}

Result<std::unique_ptr<TierStreamReceiver>> TierStreamReceiver::Start(int fd,
                                                                      int64_t capacity_bytes,
                                                                      int64_t max_entry_bytes) {
  if (capacity_bytes < 0 || max_entry_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("tier stream: capacity {} and entry limit {} bytes must not be negative",
                    capacity_bytes, max_entry_bytes));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::InvalidArgument(
        fmt::format("tier stream: descriptor {} is not open: {}", fd, std::strerror(errno)));
  }
  std::unique_ptr<TierStreamReceiver> r(
      new TierStreamReceiver(fd, capacity_bytes, max_entry_bytes));
  r->reader_ = std::thread([p = r.get()] { p->Read(); });
  return r;
}

TierStreamReceiver::~TierStreamReceiver() {
  stop_ = true;
  if (reader_.joinable()) reader_.join();
}

bool TierStreamReceiver::ReadExactly(unsigned char* p, size_t n, Status& why) {
  while (n > 0) {
    if (stop_) {
      why = Status::IoError("tier stream: stopped before the stream ended");
      return false;
    }
    pollfd pfd{fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, 50);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    const ssize_t r = ready < 0 ? -1 : ::read(fd_, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      why = Status::IoError(
          r == 0 ? std::string("tier stream: the sender closed the stream before its end (cut "
                               "short)")
                 : fmt::format("tier stream: receive failed: {}", std::strerror(errno)));
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void TierStreamReceiver::Read() {
  Status why = Status::Ok();
  unsigned char h[kHeaderBytes];
  std::vector<unsigned char> bytes;
  const auto stop = [&](Status s) {
    std::lock_guard lock(mu_);
    status_ = std::move(s);
    running_ = false;
  };
  if (!ReadExactly(h, kHeaderBytes, why)) return stop(why);
  if (Get32(h) != kMagic || Get32(h + 4) != kVersion || Get64(h + 16) != HeaderSeed({h, 16})) {
    return stop(Status::InvalidArgument(
        "tier stream: the stream header is damaged (magic, version or checksum)"));
  }
  for (int64_t i = 0;; ++i) {
    unsigned char e[kEntryBytes];
    if (!ReadExactly(e, kEntryBytes, why)) return stop(why);
    EntryHeader entry;
    if (!connector_format::ReadEntryHeader(e, entry)) {
      return stop(Status::InvalidArgument(fmt::format(
          "tier stream: header of entry {} damaged; the {} entries before it kept", i, i)));
    }
    if (entry.flags == connector_format::kEndOfStream) return stop(Status::Ok());
    if (entry.length > static_cast<uint64_t>(max_entry_bytes_)) {
      return stop(Status::ResourceExhausted(
          fmt::format("tier stream: entry {} of {} bytes is larger than the limit of {} bytes", i,
                      entry.length, max_entry_bytes_)));
    }
    bytes.resize(static_cast<size_t>(entry.length));
    if (!ReadExactly(bytes.data(), bytes.size(), why)) return stop(why);
    std::lock_guard lock(mu_);
    // A full inbox costs that entry (the decode side recomputes it), not the stream.
    if (inbox_.Put(entry.key, bytes).ok()) ++received_;
  }
}

Status TierStreamReceiver::Wait() {
  if (reader_.joinable()) reader_.join();
  std::lock_guard lock(mu_);
  return status_;
}

int64_t TierStreamReceiver::entries_received() const {
  std::lock_guard lock(mu_);
  return received_;
}

bool TierStreamReceiver::Contains(const PrefixKey& key) const {
  std::lock_guard lock(mu_);
  return inbox_.Contains(key);
}
Status TierStreamReceiver::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  std::lock_guard lock(mu_);
  return inbox_.Put(key, bytes);
}
Result<std::vector<unsigned char>> TierStreamReceiver::Get(const PrefixKey& key) {
  std::lock_guard lock(mu_);
  return inbox_.Get(key);
}
Status TierStreamReceiver::Pin(const PrefixKey& key) {
  std::lock_guard lock(mu_);
  return inbox_.Pin(key);
}
Status TierStreamReceiver::Unpin(const PrefixKey& key) {
  std::lock_guard lock(mu_);
  return inbox_.Unpin(key);
}
Status TierStreamReceiver::Evict(const PrefixKey& key) {
  std::lock_guard lock(mu_);
  return inbox_.Evict(key);
}
int64_t TierStreamReceiver::capacity_bytes() const {
  std::lock_guard lock(mu_);
  return inbox_.capacity_bytes();
}
int64_t TierStreamReceiver::used_bytes() const {
  std::lock_guard lock(mu_);
  return inbox_.used_bytes();
}
std::vector<PrefixKey> TierStreamReceiver::LruOrder() const {
  std::lock_guard lock(mu_);
  return inbox_.LruOrder();
}
void TierStreamReceiver::TrackDropped(bool on) {
  std::lock_guard lock(mu_);
  inbox_.TrackDropped(on);
}
void TierStreamReceiver::TakeDropped(std::vector<PrefixKey>& out) {
  std::lock_guard lock(mu_);
  inbox_.TakeDropped(out);
}

}  // namespace hkv
