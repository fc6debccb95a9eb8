// Tier transfer: a tier's entries as one self-checking message, and moving it over a descriptor.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

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

constexpr uint32_t kMagic = 0x544b4846;  // "FHKT"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;  // magic, version, count, checksum of the 16 before

}  // namespace

Result<std::vector<unsigned char>> SerializeTierEntries(Tier& tier) {
  const std::vector<PrefixKey> keys = tier.LruOrder();
  std::vector<std::vector<unsigned char>> entries;
  size_t total = kHeaderBytes;
  for (const PrefixKey& k : keys) {
    HKV_ASSIGN_OR_RETURN(std::vector<unsigned char> bytes, tier.Get(k));
    total += kEntryBytes + bytes.size();
    entries.push_back(std::move(bytes));
  }
  std::vector<unsigned char> out(total);
  unsigned char* p = out.data();
  Put32(p, kMagic);
  Put32(p + 4, kVersion);
  Put64(p + 8, keys.size());
  Put64(p + 16, HeaderSeed({p, 16}));
  p += kHeaderBytes;
  for (size_t i = 0; i < keys.size(); ++i) {
    connector_format::PutEntryHeader(p, {keys[i], 0, entries[i].size()});
    p += kEntryBytes;
    if (!entries[i].empty()) std::memcpy(p, entries[i].data(), entries[i].size());
    p += entries[i].size();
  }
  return out;
}

Result<int64_t> DeserializeTierEntries(std::span<const unsigned char> message, Tier& into) {
  if (message.size() < kHeaderBytes) {
    return Status::IoError(fmt::format(
        "tier transfer: message of {} bytes is shorter than its {}-byte header (truncated)",
        message.size(), kHeaderBytes));
  }
  const unsigned char* p = message.data();
  if (Get32(p) != kMagic) {
    return Status::InvalidArgument(
        "tier transfer: message header damaged: the magic is wrong (not a tier transfer message)");
  }
  if (Get32(p + 4) != kVersion) {
    return Status::InvalidArgument(
        fmt::format("tier transfer: message header damaged: version {}; expected version {}",
                    Get32(p + 4), kVersion));
  }
  if (Get64(p + 16) != HeaderSeed({p, 16})) {
    return Status::InvalidArgument("tier transfer: message header damaged: its checksum fails");
  }
  const uint64_t count = Get64(p + 8);
  size_t at = kHeaderBytes;
  int64_t taken = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (message.size() - at < kEntryBytes) {
      return Status::IoError(fmt::format(
          "tier transfer: message truncated: {} of {} entries arrived whole", taken, count));
    }
    EntryHeader h;
    if (!connector_format::ReadEntryHeader(message.data() + at, h)) {
      return Status::InvalidArgument(fmt::format(
          "tier transfer: header of entry {} damaged; {} entries before it kept", i, taken));
    }
    const PrefixKey key = h.key;
    const uint64_t length = h.length;
    at += kEntryBytes;
    if (message.size() - at < length) {
      return Status::IoError(fmt::format(
          "tier transfer: message truncated inside entry {}: {} of {} entries arrived whole", i,
          taken, count));
    }
    HKV_RETURN_IF_ERROR(into.Put(key, message.subspan(at, static_cast<size_t>(length))));
    at += static_cast<size_t>(length);
    ++taken;
  }
  if (at != message.size()) {
    return Status::InvalidArgument(fmt::format(
        "tier transfer: {} bytes after the last of {} entries", message.size() - at, count));
  }
  return taken;
}

Status SendAll(int fd, std::span<const unsigned char> bytes) {
  size_t sent = 0;
  bool socket = true;
  while (sent < bytes.size()) {
    const size_t want = bytes.size() - sent;
    ssize_t n = socket ? ::send(fd, bytes.data() + sent, want, MSG_NOSIGNAL) : -1;
    if (n < 0 && socket && errno == ENOTSOCK) {
      socket = false;
      continue;
    }
    if (!socket) n = ::write(fd, bytes.data() + sent, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(
          fmt::format("tier transfer: send on descriptor {} after {} of {} "
                      "bytes: {}",
                      fd, sent, bytes.size(), std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::vector<unsigned char>> ReceiveAll(int fd, int64_t max_bytes) {
  if (max_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("tier transfer: receive limit {} bytes is negative", max_bytes));
  }
  std::vector<unsigned char> out;
  unsigned char buffer[1 << 16];
  for (;;) {
    // One byte past the limit tells a message at the limit from a longer one.
    const size_t room = static_cast<size_t>(max_bytes) + 1 - out.size();
    const ssize_t n = ::read(fd, buffer, std::min(sizeof(buffer), room));
    if (n == 0) return out;
    if (n > 0 && out.size() + static_cast<size_t>(n) > static_cast<size_t>(max_bytes)) {
      return Status::ResourceExhausted(fmt::format(
          "tier transfer: the message on descriptor {} is larger than the limit of {} bytes", fd,
          max_bytes));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(
          fmt::format("tier transfer: receive on descriptor {} after {} bytes: {}", fd, out.size(),
                      std::strerror(errno)));
    }
    out.insert(out.end(), buffer, buffer + n);
  }
}

}  // namespace hkv
