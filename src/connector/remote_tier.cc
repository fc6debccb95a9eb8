// RemoteTier: entries as checked values on a Redis server, with this tier's own budget and LRU.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <sodium.h>
#include <sys/uio.h>

#include <hkv/connector/remote_tier.h>

#include "checked_format.h"

namespace hkv {
namespace {

using connector_format::Get32;
using connector_format::Get64;
using connector_format::Put32;
using connector_format::Put64;

constexpr uint64_t kMagic = 0x006d657274766b68ull;        // "hkvtrem"
constexpr uint64_t kMagicSigned = 0x0067697374766b68ull;  // "hkvtsig": a signature follows
constexpr size_t kSignature = crypto_generichash_BYTES;   // 32
// Bytes of SET commands a PutMany sends per round trip.
constexpr size_t kPipelineBytes = size_t{1} << 20;
// Values at least this large are written to the socket directly (AppendSet).
constexpr size_t kDirectWriteBytes = size_t{64} << 10;
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
      index_("remote tier " + server_, options.capacity_bytes) {
  if (!options.secret.empty()) {
    // The secret may be any length; the MAC key is a fixed-size digest of it.
    sign_key_.resize(crypto_generichash_KEYBYTES);
    crypto_generichash(sign_key_.data(), sign_key_.size(),
                       reinterpret_cast<const unsigned char*>(options.secret.data()),
                       options.secret.size(), nullptr, 0);
  }
}

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
  if (options.max_value_bytes < 1) {
    return Status::InvalidArgument(
        fmt::format("remote tier: value limit {} bytes: expected >= 1", options.max_value_bytes));
  }
  if (options.model == ModelIdentity{}) {
    return Status::InvalidArgument(
        "remote tier: no model identity (ComputeModelIdentity): entries of different models "
        "must not share a key");
  }
  if (!options.secret.empty() && sodium_init() < 0) {
    return Status::Unsupported("remote tier: libsodium failed to initialise, cannot sign");
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
  // Keep the reply buffer between calls: by default hiredis frees it after every reply larger
  // than 16 KiB, and a block-sized value then regrows it from scratch.
  c->reader->maxbuf = 0;
  if (!options_.password.empty()) {
    const std::string& u = options_.username;
    const std::string& p = options_.password;
    Reply auth(static_cast<redisReply*>(
        u.empty() ? redisCommand(c, "AUTH %b", p.data(), p.size())
                  : redisCommand(c, "AUTH %b %b", u.data(), u.size(), p.data(), p.size())));
    if (!auth || auth->type == REDIS_REPLY_ERROR) {
      const std::string why = !auth ? c->errstr : auth->str;
      redisFree(c);
      return Status::IoError(fmt::format("remote tier: {} refuses AUTH as {}: {}", server_,
                                         u.empty() ? "the default user" : "user '" + u + "'", why));
    }
  }
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
  ++round_trips_;
  Reply r(static_cast<redisReply*>(redisCommand(context_, "EXISTS %b", k.data(), k.size())));
  if (!r || r->type != REDIS_REPLY_INTEGER) {
    (void)Fail("EXISTS");
    return false;
  }
  return r->integer > 0;
}

void RemoteTier::ContainsMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const {
  if (!options_.pipeline) return Tier::ContainsMany(keys, out);
  std::fill(out.begin(), out.end(), 0);
  size_t asked = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (index_.Contains(keys[i])) out[i] = 1;
    asked += out[i] == 0 ? 1 : 0;
  }
  if (asked == 0 || !Ready().ok()) return;
  ++round_trips_;
  std::string k;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] != 0) continue;
    k = ServerKey(keys[i]);
    redisAppendCommand(context_, "EXISTS %b", k.data(), k.size());
  }
  // Every reply is read, so the connection stays in step; a failure drops it (and the answers
  // not yet read are no).
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] != 0) continue;
    void* reply = nullptr;
    if (redisGetReply(context_, &reply) != REDIS_OK) {
      (void)Fail("EXISTS");
      return;
    }
    Reply r(static_cast<redisReply*>(reply));
    if (r->type != REDIS_REPLY_INTEGER) {
      (void)Fail("EXISTS");
      return;
    }
    out[i] = r->integer > 0 ? 1 : 0;
  }
}

void RemoteTier::Sign(const std::string& k, std::span<const unsigned char> header,
                      std::span<const unsigned char> payload, unsigned char* out) const {
  crypto_generichash_state st;
  crypto_generichash_init(&st, sign_key_.data(), sign_key_.size(), kSignature);
  // The server key binds the value to its name: a signed value moved to another key fails.
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(k.data()), k.size());
  crypto_generichash_update(&st, header.data(), header.size());
  crypto_generichash_update(&st, payload.data(), payload.size());
  crypto_generichash_final(&st, out, kSignature);
}

size_t RemoteTier::BuildHead(const std::string& k, const PrefixKey& key,
                             std::span<const unsigned char> bytes, unsigned char* h) const {
  const bool sign = !sign_key_.empty();
  Put64(h, sign ? kMagicSigned : kMagic);
  Put32(h + 8, kVersion);
  Put32(h + 12, static_cast<uint32_t>(key.group));
  Put64(h + 16, key.hash.lo);
  Put64(h + 24, key.hash.hi);
  Put64(h + 32, options_.model.lo);
  Put64(h + 40, options_.model.hi);
  Put64(h + 48, bytes.size());
  Put64(h + kChecksumAt, connector_format::SeededChecksum({h, kChecksumAt}, bytes));
  if (sign) Sign(k, {h, kHeader}, bytes, h + kHeader);
  return kHeader + (sign ? kSignature : 0);
}

bool RemoteTier::AppendSet(const std::string& k, const PrefixKey& key,
                           std::span<const unsigned char> bytes) {
  unsigned char head[kHeader + kSignature];
  const size_t head_bytes = BuildHead(k, key, bytes, head);
  if (bytes.size() < kDirectWriteBytes) {
    value_.resize(head_bytes + bytes.size());
    std::memcpy(value_.data(), head, head_bytes);
    if (!bytes.empty()) std::memcpy(value_.data() + head_bytes, bytes.data(), bytes.size());
    // NX: an identity names content, so a value another process stored is as good as ours (a
    // planted one is found and deleted by the first Get that checks it).
    return redisAppendCommand(context_, "SET %b %b NX", k.data(), k.size(), value_.data(),
                              value_.size()) == REDIS_OK;
  }
  // Large: what is queued goes first, then the command straight from the caller's bytes. hiredis
  // would copy the value into its output buffer and move the unsent rest after every write.
  for (int done = 0; done == 0;) {
    if (redisBufferWrite(context_, &done) == REDIS_ERR) return false;
  }
  const std::string prefix = fmt::format("*4\r\n$3\r\nSET\r\n${}\r\n{}\r\n${}\r\n", k.size(), k,
                                         head_bytes + bytes.size());
  static constexpr std::string_view kSuffix = "\r\n$2\r\nNX\r\n";
  iovec iov[4] = {{const_cast<char*>(prefix.data()), prefix.size()},
                  {head, head_bytes},
                  {const_cast<unsigned char*>(bytes.data()), bytes.size()},
                  {const_cast<char*>(kSuffix.data()), kSuffix.size()}};
  std::span<iovec> left(iov);
  while (!left.empty()) {
    const ssize_t n = ::writev(context_->fd, left.data(), static_cast<int>(left.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // an error, or the send timeout passed
    auto w = static_cast<size_t>(n);
    while (!left.empty() && w >= left.front().iov_len) {
      w -= left.front().iov_len;
      left = left.subspan(1);
    }
    if (!left.empty()) {
      left.front().iov_base = static_cast<char*>(left.front().iov_base) + w;
      left.front().iov_len -= w;
    }
  }
  return true;
}

void RemoteTier::IndexStored(const PrefixKey& key, int64_t bytes,
                             std::span<const PrefixKey> victims, std::vector<std::string>& dels) {
  for (const PrefixKey& v : victims) {
    index_.Erase(v);
    // Deleted only once the new entry is stored, so a failed Put evicts nothing.
    if (options_.ownership == RemoteTierOptions::Ownership::kTier) {
      dels.push_back(ServerKey(v));
      Dropped(v);
    }
  }
  index_.Insert(key, bytes);
}

void RemoteTier::DeleteAll(std::span<const std::string> keys) {
  if (keys.empty()) return;
  ++round_trips_;
  for (const std::string& k : keys)
    redisAppendCommand(context_, "DEL %b", k.data(), k.size());
  // A DEL that fails leaves a value nobody indexes; the server's memory policy bounds those.
  for (size_t i = 0; i < keys.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(context_, &reply) != REDIS_OK) {
      (void)Fail("DEL");
      return;
    }
    freeReplyObject(reply);
  }
}

Status RemoteTier::Put(const PrefixKey& key, std::span<const unsigned char> bytes) {
  if (index_.Contains(key)) {
    index_.Touch(key);
    return Status::Ok();
  }
  HKV_ASSIGN_OR_RETURN(const std::vector<PrefixKey> victims,
                       index_.Victims(key, static_cast<int64_t>(bytes.size())));
  HKV_RETURN_IF_ERROR(Ready());
  const std::string k = ServerKey(key);
  ++round_trips_;
  if (!AppendSet(k, key, bytes)) return Fail("SET");
  void* reply = nullptr;
  if (redisGetReply(context_, &reply) != REDIS_OK) return Fail("SET");
  Reply r(static_cast<redisReply*>(reply));
  if (r->type == REDIS_REPLY_ERROR) return Fail("SET");
  std::vector<std::string> dels;
  IndexStored(key, static_cast<int64_t>(bytes.size()), victims, dels);
  DeleteAll(dels);
  return Status::Ok();
}

void RemoteTier::PutMany(std::span<const PrefixKey> keys,
                         std::span<const std::span<const unsigned char>> values,
                         std::span<Status> out) {
  if (!options_.pipeline) return Tier::PutMany(keys, values, out);
  // The SETs pipelined, then the index in order, then one round trip for the deletions. A key
  // repeated in the batch is sent once: the repeats go through the in-order pass below.
  std::vector<unsigned char> sent(keys.size(), 0);
  std::unordered_set<PrefixKey, PrefixKeyHash> seen;
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i] = Status::Ok();
    if (!index_.Contains(keys[i]) && seen.insert(keys[i]).second) {
      sent[i] = 1;
      ++n;
    }
  }
  if (n > 0) {
    if (Status ready = Ready(); !ready.ok()) {
      for (size_t i = 0; i < keys.size(); ++i)
        if (sent[i] != 0) out[i] = ready;
      return;
    }
    // Commands go out in groups of about kPipelineBytes, each one round trip: hiredis moves the
    // unsent rest of its output buffer after every write, so one huge batch costs more than a few.
    std::string k;
    size_t group_begin = 0, pending = 0, appended = 0;
    bool failed = false;
    for (size_t i = 0; i < keys.size() && !failed; ++i) {
      if (sent[i] != 0) {
        k = ServerKey(keys[i]);
        if (!AppendSet(k, keys[i], values[i])) {
          const Status down = Fail("SET");
          for (size_t m = group_begin; m < keys.size(); ++m)
            if (sent[m] != 0) out[m] = down;
          break;
        }
        pending += values[i].size();
        ++appended;
      }
      if (pending < kPipelineBytes && i + 1 < keys.size()) continue;
      if (appended == 0) break;  // the rest were held already
      ++round_trips_;
      for (size_t j = group_begin; j <= i; ++j) {
        if (sent[j] == 0) continue;
        void* reply = nullptr;
        if (redisGetReply(context_, &reply) != REDIS_OK) {
          const Status down = Fail("SET");
          for (size_t m = j; m < keys.size(); ++m)
            if (sent[m] != 0) out[m] = down;
          failed = true;
          break;
        }
        Reply r(static_cast<redisReply*>(reply));
        if (r->type == REDIS_REPLY_ERROR) {
          out[j] = Status::IoError(fmt::format("remote tier: SET on {} failed: {}", server_,
                                               std::string(r->str, r->len)));
          ++server_errors_;
        }
      }
      group_begin = i + 1;
      pending = appended = 0;
    }
  }
  std::vector<std::string> dels;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].ok()) continue;
    if (index_.Contains(keys[i])) {
      index_.Touch(keys[i]);
      continue;
    }
    if (sent[i] == 0) {
      // Held when the batch began and evicted by an earlier entry of it since (its deletion is
      // queued), or a repeat whose first Put was refused: its value was not sent. Delete what is
      // queued first, then store it on its own.
      DeleteAll(dels);
      dels.clear();
      out[i] = Put(keys[i], values[i]);
      continue;
    }
    const int64_t size = static_cast<int64_t>(values[i].size());
    Result<std::vector<PrefixKey>> victims = index_.Victims(keys[i], size);
    if (!victims.ok()) {
      // Stored on the server, but it does not fit this tier's own budget: not indexed. Under
      // kTier nothing unindexed may stay.
      out[i] = victims.status();
      if (options_.ownership == RemoteTierOptions::Ownership::kTier) {
        dels.push_back(ServerKey(keys[i]));
      }
      continue;
    }
    IndexStored(keys[i], size, *victims, dels);
  }
  if (context_ != nullptr) DeleteAll(dels);
}

void RemoteTier::AppendGet(const std::string& k) {
  // GETRANGE reads at most one byte past the limit, so a value too large to trust is never
  // transferred in full. It reads a missing key as an empty string, so EXISTS goes with it.
  redisAppendCommand(context_, "EXISTS %b", k.data(), k.size());
  redisAppendCommand(context_, "GETRANGE %b 0 %lld", k.data(), k.size(),
                     static_cast<long long>(options_.max_value_bytes));
}

Result<std::vector<unsigned char>> RemoteTier::ReceiveGet(const PrefixKey& key,
                                                          const std::string& k,
                                                          std::vector<std::string>& dels) {
  void* first = nullptr;
  void* second = nullptr;
  if (redisGetReply(context_, &first) != REDIS_OK) return Fail("EXISTS");
  Reply exists(static_cast<redisReply*>(first));
  if (redisGetReply(context_, &second) != REDIS_OK) return Fail("GETRANGE");
  Reply r(static_cast<redisReply*>(second));
  if (exists->type != REDIS_REPLY_INTEGER || r->type == REDIS_REPLY_ERROR) return Fail("GETRANGE");
  if (exists->integer == 0) {
    ++misses_;
    // Ours but gone (the server restarted or evicted it): forget it, pins and all.
    if (index_.Contains(key)) {
      index_.Erase(key);
      Dropped(key);
    }
    return Status::NotFound(
        fmt::format("remote tier: no entry for {} on {}", TierKeyName(key), server_));
  }
  if (r->type == REDIS_REPLY_STRING && r->len > static_cast<size_t>(options_.max_value_bytes)) {
    ++misses_;
    return Status::NotFound(
        fmt::format("remote tier: the value of {} is larger than this tier's limit of {} bytes",
                    TierKeyName(key), options_.max_value_bytes));
  }
  const auto* v = reinterpret_cast<const unsigned char*>(r->str);
  const size_t n = r->type == REDIS_REPLY_STRING ? r->len : 0;
  const bool signed_value = n >= kHeader && Get64(v) == kMagicSigned;
  const size_t offset = kHeader + (signed_value ? kSignature : 0);
  std::string damage, forgery;
  if (r->type != REDIS_REPLY_STRING || n < kHeader) {
    damage = fmt::format("a value of {} bytes, shorter than its header", n);
  } else if (Get64(v) != kMagic && !signed_value) {
    damage = "not a remote tier value";
  } else if (signed_value && sign_key_.empty()) {
    // Valid for the tiers that hold the secret: a miss here, left in place for them.
    ++misses_;
    return Status::NotFound(fmt::format(
        "remote tier: entry {} is signed and this tier has no secret", TierKeyName(key)));
  } else if (!signed_value && !sign_key_.empty()) {
    forgery = "an unsigned value where every value must be signed";
  } else if (n < offset) {
    damage = fmt::format("a signed value of {} bytes, shorter than its header and signature", n);
  } else if (Get32(v + 8) != kVersion) {
    damage = fmt::format("a version {} value; expected version {}", Get32(v + 8), kVersion);
  } else if (Get32(v + 12) != static_cast<uint32_t>(key.group) || Get64(v + 16) != key.hash.lo ||
             Get64(v + 24) != key.hash.hi) {
    damage = "another key's value";
  } else if (Get64(v + 32) != options_.model.lo || Get64(v + 40) != options_.model.hi) {
    damage = fmt::format("a value of model {:016x}{:016x}, not of {}", Get64(v + 40), Get64(v + 32),
                         options_.model.Hex());
  } else if (Get64(v + 48) != n - offset) {
    damage =
        fmt::format("a {} value: its header says {} payload bytes, it has {}",
                    Get64(v + 48) > n - offset ? "truncated" : "padded", Get64(v + 48), n - offset);
  } else if (connector_format::SeededChecksum({v, kChecksumAt}, {v + offset, n - offset}) !=
             Get64(v + kChecksumAt)) {
    damage = "a value failing its checksum";
  } else if (signed_value) {
    unsigned char expected[kSignature];
    Sign(k, {v, kHeader}, {v + offset, n - offset}, expected);
    if (sodium_memcmp(expected, v + kHeader, kSignature) != 0) {
      forgery = "a value whose signature is not this tier's secret's";
    }
  }
  if (!damage.empty() || !forgery.empty()) {
    ++(forgery.empty() ? corruptions_ : forgeries_);
    ++misses_;
    if (index_.Contains(key)) index_.Erase(key);
    dels.push_back(k);  // deleted once every pipelined reply is read
    Dropped(key);
    return Status::NotFound(fmt::format("remote tier: entry {} lost: {}", TierKeyName(key),
                                        forgery.empty() ? damage : "refused " + forgery));
  }
  ++hits_;
  if (index_.Contains(key)) index_.Touch(key);
  return std::vector<unsigned char>(v + offset, v + n);
}

Result<std::vector<unsigned char>> RemoteTier::Get(const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(Ready());
  const std::string k = ServerKey(key);
  ++round_trips_;
  AppendGet(k);
  std::vector<std::string> dels;
  Result<std::vector<unsigned char>> got = ReceiveGet(key, k, dels);
  if (context_ != nullptr) DeleteAll(dels);
  return got;
}

void RemoteTier::GetMany(std::span<const PrefixKey> keys,
                         std::vector<Result<std::vector<unsigned char>>>& out) {
  if (!options_.pipeline) return Tier::GetMany(keys, out);
  out.clear();
  if (keys.empty()) return;
  if (Status ready = Ready(); !ready.ok()) {
    out.assign(keys.size(), ready);
    return;
  }
  std::vector<std::string> names(keys.size());
  ++round_trips_;
  for (size_t i = 0; i < keys.size(); ++i) {
    names[i] = ServerKey(keys[i]);
    AppendGet(names[i]);
  }
  std::vector<std::string> dels;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (context_ == nullptr) {  // a failed reply dropped the connection: the rest fail too
      out.emplace_back(Status::IoError(fmt::format("remote tier: {} is down", server_)));
      continue;
    }
    out.push_back(ReceiveGet(keys[i], names[i], dels));
  }
  if (context_ != nullptr) DeleteAll(dels);
}

namespace {

// Calls `each` with every key of the server matching `pattern` (SCAN, a page at a time).
template <typename Each>
Status ScanKeys(redisContext* c, const std::string& pattern, Each&& each) {
  std::string cursor = "0";
  do {
    Reply r(static_cast<redisReply*>(redisCommand(c, "SCAN %s MATCH %b COUNT 1000", cursor.c_str(),
                                                  pattern.data(), pattern.size())));
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status::IoError("SCAN");
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* keys = r->element[1];
    for (size_t i = 0; i < keys->elements; ++i)
      each(std::string_view(keys->element[i]->str, keys->element[i]->len));
  } while (cursor != "0");
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::pair<ModelIdentity, int64_t>>> RemoteTier::ListModels() {
  HKV_RETURN_IF_ERROR(Ready());
  std::vector<std::pair<ModelIdentity, int64_t>> models;
  const std::string prefix = options_.name_space + ":";
  const Status s = ScanKeys(context_, prefix + "*", [&](std::string_view k) {
    // <namespace>:<model hex>:<digest>-<group>
    const Result<ModelIdentity> m = ModelIdentity::FromHex(k.substr(prefix.size(), 32));
    if (!m.ok() || k.size() <= prefix.size() + 32 || k[prefix.size() + 32] != ':') return;
    auto it =
        std::find_if(models.begin(), models.end(), [&](const auto& e) { return e.first == *m; });
    if (it == models.end()) {
      models.emplace_back(*m, 1);
    } else {
      ++it->second;
    }
  });
  if (!s.ok()) return Fail("SCAN");
  std::sort(models.begin(), models.end(),
            [](const auto& a, const auto& b) { return a.first.Hex() < b.first.Hex(); });
  return models;
}

Result<int64_t> RemoteTier::DropModel(const ModelIdentity& model) {
  HKV_RETURN_IF_ERROR(Ready());
  std::vector<std::string> keys;
  const Status s = ScanKeys(context_, fmt::format("{}:{}:*", options_.name_space, model.Hex()),
                            [&](std::string_view k) { keys.emplace_back(k); });
  if (!s.ok()) return Fail("SCAN");
  for (size_t at = 0; at < keys.size(); at += 1000) {
    DeleteAll(std::span(keys).subspan(at, std::min<size_t>(1000, keys.size() - at)));
    if (context_ == nullptr)
      return Status::IoError(fmt::format("remote tier: DEL on {} failed", server_));
  }
  if (model == options_.model) {
    for (const PrefixKey& k : index_.LruOrder())
      index_.Erase(k);
  }
  return static_cast<int64_t>(keys.size());
}

Status RemoteTier::Evict(const PrefixKey& key) {
  HKV_RETURN_IF_ERROR(index_.CheckEvict(key));
  if (options_.ownership == RemoteTierOptions::Ownership::kTier) {
    HKV_RETURN_IF_ERROR(Ready());
    const std::string k = ServerKey(key);
    ++round_trips_;
    Reply r(static_cast<redisReply*>(redisCommand(context_, "DEL %b", k.data(), k.size())));
    if (!r || r->type == REDIS_REPLY_ERROR) return Fail("DEL");
  }
  if (options_.ownership == RemoteTierOptions::Ownership::kTier) Dropped(key);
  index_.Erase(key);
  return Status::Ok();
}

}  // namespace hkv
