// RemoteTier: entries as checked values on a Redis server, with this tier's own budget and LRU.
#include <cstring>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <hkv/connector/remote_tier.h>

#include "checked_format.h"

namespace hkv {
namespace {

using connector_format::Get32;
using connector_format::Get64;
using connector_format::Put32;
using connector_format::Put64;

constexpr uint64_t kMagic = 0x006d657274766b68ull;  // "hkvtrem"
// Version 2 added the model identity.
constexpr uint32_t kVersion = 2;
// magic, version, key group, key digest (lo, hi), model (lo, hi), payload bytes, checksum
constexpr size_t kHeader = 64;
constexpr size_t kChecksumAt = 56;

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

timeval Millis(int ms) {
  return timeval{ms / 1000, (ms % 1000) * 1000};
}

}  // namespace

RemoteTier::RemoteTier(const RemoteTierOptions& options)
    : options_(options),
      server_(options.unix_socket.empty() ? fmt::format("{}:{}", options.host, options.port)
                                          : options.unix_socket),
      index_("remote tier " + server_, options.capacity_bytes) {}

RemoteTier::~RemoteTier() {
  if (context_ != nullptr) redisFree(context_);
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Connect(const RemoteTierOptions& options) {
  if (options.unix_socket.empty()) {
    if (options.host.empty()) {
      return Status::InvalidArgument(
          "remote tier: host is empty: expected a host name or address (or a unix socket)");
    }
    if (options.port < 1 || options.port > 65535) {
      return Status::InvalidArgument(fmt::format(
          "remote tier: server '{}' port {}: expected 1..65535", options.host, options.port));
    }
  }
  if (options.name_space.empty()) {
    return Status::InvalidArgument("remote tier: namespace is empty: expected a name");
  }
  if (options.name_space.find(':') != std::string::npos) {
    return Status::InvalidArgument(
        fmt::format("remote tier: namespace '{}' contains ':': expected a name without it",
                    options.name_space));
  }
  if (options.timeout_ms < 1) {
    return Status::InvalidArgument(
        fmt::format("remote tier: timeout {} ms: expected >= 1", options.timeout_ms));
  }
  if (options.retry_after_ms < 0) {
    return Status::InvalidArgument(
        fmt::format("remote tier: retry interval {} ms: expected >= 0", options.retry_after_ms));
  }
  if (options.capacity_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("remote tier: capacity {} bytes: expected >= 0", options.capacity_bytes));
  }
  if (options.model == ModelIdentity{}) {
    return Status::InvalidArgument(
        "remote tier: no model identity (ComputeModelIdentity): entries of different models "
        "must not share a key");
  }
  std::unique_ptr<RemoteTier> tier(new RemoteTier(options));
  HKV_RETURN_IF_ERROR(tier->Open());
  return tier;
}

Status RemoteTier::Open() const {
  redisContext* c =
      options_.unix_socket.empty()
          ? redisConnectWithTimeout(options_.host.c_str(), options_.port,
                                    Millis(options_.timeout_ms))
          : redisConnectUnixWithTimeout(options_.unix_socket.c_str(), Millis(options_.timeout_ms));
  if (c == nullptr || c->err != 0) {
    const std::string why = c == nullptr ? "out of memory" : c->errstr;
    if (c != nullptr) redisFree(c);
    return Status::IoError(fmt::format("remote tier: cannot connect to {}: {}", server_, why));
  }
  redisSetTimeout(c, Millis(options_.timeout_ms));
  Reply pong(static_cast<redisReply*>(redisCommand(c, "PING")));
  if (!pong || pong->type == REDIS_REPLY_ERROR) {
    const std::string why = !pong ? c->errstr : pong->str;
    redisFree(c);
    return Status::IoError(fmt::format("remote tier: {} does not answer PING: {}", server_, why));
  }
  context_ = c;
  return Status::Ok();
}

Status RemoteTier::Fail(const char* what) const {
  ++server_errors_;
  std::string why = context_ != nullptr && context_->err != 0 ? context_->errstr : "error reply";
  if (context_ != nullptr) {
    redisFree(context_);
    context_ = nullptr;
  }
  retry_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_after_ms);
  return Status::IoError(fmt::format("remote tier: {} on {} failed: {}", what, server_, why));
}

Status RemoteTier::Ready() const {
  if (context_ != nullptr) return Status::Ok();
  if (std::chrono::steady_clock::now() < retry_at_) {
    ++server_errors_;
    return Status::IoError(
        fmt::format("remote tier: {} is down (retrying after a short interval)", server_));
  }
  const Status opened = Open();
  if (!opened.ok()) {
    ++server_errors_;
    retry_at_ =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_after_ms);
    return opened;
  }
  ++reconnects_;
  return Status::Ok();
}

std::string RemoteTier::ServerKey(const PrefixKey& key) const {
  return fmt::format("{}:{}:{:016x}{:016x}-{:x}", options_.name_space, options_.model.Hex(),
                     key.hash.hi, key.hash.lo, static_cast<uint32_t>(key.group));
}

bool RemoteTier::Contains(const PrefixKey& key) const {
  if (index_.Contains(key)) return true;
  if (!Ready().ok()) return false;
  const std::string k = ServerKey(key);
  Reply r(static_cast<redisReply*>(redisCommand(context_, "EXISTS %b", k.data(), k.size())));
  if (!r || r->type != REDIS_REPLY_INTEGER) {
    (void)Fail("EXISTS");
    return false;
  }
  return r->integer > 0;
}

Status RemoteTier::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  if (index_.Contains(key)) {
    index_.Touch(key);
    return Status::Ok();
  }
  HKV_ASSIGN_OR_RETURN(const std::vector<PrefixKey> victims,
                       index_.Victims(key, static_cast<int64_t>(bytes.size())));
  HKV_RETURN_IF_ERROR(Ready());
  std::vector<unsigned char> value(kHeader + bytes.size());
  unsigned char* h = value.data();
  Put64(h, kMagic);
  Put32(h + 8, kVersion);
  Put32(h + 12, static_cast<uint32_t>(key.group));
  Put64(h + 16, key.hash.lo);
  Put64(h + 24, key.hash.hi);
  Put64(h + 32, options_.model.lo);
  Put64(h + 40, options_.model.hi);
  Put64(h + 48, bytes.size());
  Put64(h + kChecksumAt, connector_format::SeededChecksum({h, kChecksumAt}, bytes));
  if (!bytes.empty()) std::memcpy(h + kHeader, bytes.data(), bytes.size());
  const std::string k = ServerKey(key);
  // NX: an identity names content, so a value another process stored is as good as ours.
  Reply r(static_cast<redisReply*>(
      redisCommand(context_, "SET %b %b NX", k.data(), k.size(), value.data(), value.size())));
  if (!r || r->type == REDIS_REPLY_ERROR) return Fail("SET");
  // Victims go only once the new entry is stored, so a failed Put evicts nothing. A DEL that
  // fails leaves a value nobody indexes; the server's memory policy bounds such leftovers.
  for (const PrefixKey& v : victims) {
    index_.Erase(v);
    const std::string vk = ServerKey(v);
    Reply d(static_cast<redisReply*>(redisCommand(context_, "DEL %b", vk.data(), vk.size())));
    if (!d) {
      (void)Fail("DEL");
      break;
    }
  }
  index_.Insert(key, static_cast<int64_t>(bytes.size()));
  return Status::Ok();
}

Result<std::vector<unsigned char>> RemoteTier::Get(const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(Ready());
  const std::string k = ServerKey(key);
  Reply r(static_cast<redisReply*>(redisCommand(context_, "GET %b", k.data(), k.size())));
  if (!r || r->type == REDIS_REPLY_ERROR) return Fail("GET");
  if (r->type == REDIS_REPLY_NIL) {
    ++misses_;
    // Ours but gone (the server restarted or evicted it): forget it, pins and all.
    if (index_.Contains(key)) index_.Erase(key);
    return Status::NotFound(
        fmt::format("remote tier: no entry for {} on {}", TierKeyName(key), server_));
  }
  const auto* v = reinterpret_cast<const unsigned char*>(r->str);
  const size_t n = r->type == REDIS_REPLY_STRING ? r->len : 0;
  std::string damage;
  if (r->type != REDIS_REPLY_STRING || n < kHeader) {
    damage = fmt::format("a value of {} bytes, shorter than its header", n);
  } else if (Get64(v) != kMagic) {
    damage = "not a remote tier value";
  } else if (Get32(v + 8) != kVersion) {
    damage = fmt::format("a version {} value; expected version {}", Get32(v + 8), kVersion);
  } else if (Get32(v + 12) != static_cast<uint32_t>(key.group) || Get64(v + 16) != key.hash.lo ||
             Get64(v + 24) != key.hash.hi) {
    damage = "another key's value";
  } else if (Get64(v + 32) != options_.model.lo || Get64(v + 40) != options_.model.hi) {
    damage = fmt::format("a value of model {:016x}{:016x}, not of {}", Get64(v + 40), Get64(v + 32),
                         options_.model.Hex());
  } else if (Get64(v + 48) != n - kHeader) {
    damage = fmt::format("a {} value: its header says {} payload bytes, it has {}",
                         Get64(v + 48) > n - kHeader ? "truncated" : "padded", Get64(v + 48),
                         n - kHeader);
  } else if (connector_format::SeededChecksum({v, kChecksumAt}, {v + kHeader, n - kHeader}) !=
             Get64(v + kChecksumAt)) {
    damage = "a value failing its checksum";
  }
  if (!damage.empty()) {
    ++corruptions_;
    ++misses_;
    if (index_.Contains(key)) index_.Erase(key);
    Reply d(static_cast<redisReply*>(redisCommand(context_, "DEL %b", k.data(), k.size())));
    if (!d) (void)Fail("DEL");
    return Status::NotFound(
        fmt::format("remote tier: entry {} lost: {}", TierKeyName(key), damage));
  }
  ++hits_;
  if (index_.Contains(key)) index_.Touch(key);
  return std::vector<unsigned char>(v + kHeader, v + n);
}

Status RemoteTier::Evict(const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(index_.CheckEvict(key));
  HKV_RETURN_IF_ERROR(Ready());
  const std::string k = ServerKey(key);
  Reply r(static_cast<redisReply*>(redisCommand(context_, "DEL %b", k.data(), k.size())));
  if (!r || r->type == REDIS_REPLY_ERROR) return Fail("DEL");
  index_.Erase(key);
  return Status::Ok();
}

}  // namespace hkv
