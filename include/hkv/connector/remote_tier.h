// RemoteTier: the Tier on a shared Redis (or Valkey) server, so that several engine processes
// share prefixes: what one stores, another finds.
//
// Contract: as Tier (hkv/connector/tier.h), with what a shared store changes:
// - Keys live under `<namespace>:<model hex>:<digest hex>-<group hex>`; engines of one model
//   (ModelIdentity) that share a namespace share entries, and another model's keys are never
//   asked for. A value is a 64-byte header (magic, version, key, model, length, XXH3 over header
//   and payload) and the payload, so a value that is damaged, truncated, another key's or another
//   model's is a miss (NotFound saying what was wrong; the value is deleted and
//   corruptions_detected() counts it), never wrong bytes.
// - Signing: with a `secret`, every value also carries a keyed BLAKE2b-256 (libsodium) over its
//   server key, header and payload, and every value read must carry a valid one. A writer without
//   the secret cannot plant a block (an unsigned value, or one signed with another key, is a miss:
//   deleted, counted by forgeries_refused()), nor move a signed value to another key. A signed
//   value read by a tier without a secret is a miss too, and left in place for those that have it.
//   Tiers sharing a namespace must share the secret.
// - Ownership: entries on a shared server belong to no engine. By default (kServer) a tier never
//   deletes an entry to make room: its budget, LRU order and pins cover only its own index of what
//   it put, and the server's maxmemory-policy (e.g. allkeys-lru) bounds the server's memory. With
//   kTier, a Put deletes this tier's least recently used unpinned entries (DEL) to fit, and Evict
//   deletes - for a server one engine has to itself. Damaged and forged values are deleted in both.
// - Contains and Get also see every other process's entries in the namespace (EXISTS / GET).
// - AUTH: with a `password` (and an ACL `username`) the tier authenticates on every connection; a
//   refusal is kIoError naming the server and the user. Over a Unix socket (`unix_socket`) the
//   server needs no TCP port at all.
// - A Put of a key the server already holds (content-named) keeps the stored value.
// - Bounded reads: a Get reads at most `max_value_bytes` + 1 bytes of a value (GETRANGE).
// - Batches: ContainsMany, GetMany and PutMany pipeline their commands (EXISTS, GETRANGE, SET
//   NX): one round trip for the batch (PutMany: one per MiB of values), and one for any deletions.
// - A server that is down, slow (past the timeout) or answers with an error never crashes or
//   hangs a caller: Contains says false, Get and Put fail with kIoError naming the server, the
//   index is left as it was, server_errors() counts it. The connection is dropped and retried at
//   most once per `retry_after_ms`, so a dead server costs one failed connect per interval, and
//   calls in between fail at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <hkv/connector/model_identity.h>
#include <hkv/connector/tier_index.h>

struct redisContext;

namespace hkv {

struct RemoteTierOptions {
  std::string host = "127.0.0.1";  // TCP; ignored when unix_socket is set
  int port = 6379;
  std::string unix_socket;  // a path: connect over a Unix domain socket instead
  std::string name_space = "hkv";
  ModelIdentity model;   // the model whose blocks this tier holds (ComputeModelIdentity)
  std::string username;  // ACL user for AUTH; empty: the default user
  std::string password;  // AUTH when not empty
  std::string secret;    // signs and checks every value when not empty
  enum class Ownership { kServer, kTier };
  Ownership ownership = Ownership::kServer;
  // The largest value a Get reads (header and signature included); a larger one is a miss, read
  // no further than one byte past the limit, and left in place.
  int64_t max_value_bytes = int64_t{256} << 20;
  // ContainsMany and PutMany pipeline their commands: one round trip per batch. Off: one per key
  // (to measure the difference).
  bool pipeline = true;
  int64_t capacity_bytes = int64_t{1} << 30;  // this tier's own entries (payload bytes)
  int timeout_ms = 1000;                      // connect and per-command
  int retry_after_ms = 200;                   // after a failure, calls fail fast this long
};

class RemoteTier final : public Tier {
 public:
  // Connects and checks the server answers PING. kInvalidArgument for bad options (empty host or
  // namespace, port outside 1..65535, timeouts < 1 ms); kIoError naming the server when it cannot
  // be reached.
  static Result<std::unique_ptr<RemoteTier>> Connect(const RemoteTierOptions& options);
  ~RemoteTier() override;
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  bool Contains(const PrefixKey& key) const override;
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  void ContainsMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const override;
  void PutMany(std::span<const PrefixKey> keys,
               std::span<const std::span<const unsigned char>> values,
               std::span<Status> out) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  void GetMany(std::span<const PrefixKey> keys,
               std::vector<Result<std::vector<unsigned char>>>& out) override;
  Status Pin(const PrefixKey& key) override { return index_.Pin(key); }
  Status Unpin(const PrefixKey& key) override { return index_.Unpin(key); }
  Status Evict(const PrefixKey& key) override;
  int64_t capacity_bytes() const override { return index_.capacity_bytes(); }
  int64_t used_bytes() const override { return index_.used_bytes(); }
  std::vector<PrefixKey> LruOrder() const override { return index_.LruOrder(); }
  std::string_view medium() const override { return "REMOTE"; }
  bool Remote() const override { return true; }
  // What left the server by this tier's hand or to its knowledge: entries it deleted (kTier
  // evictions, damaged and forged values) and its entries a Get found gone. Under kServer, a
  // budget eviction only forgets and is not a removal.
  void TrackDropped(bool on) override { track_ = on; }
  void TakeDropped(std::vector<PrefixKey>& out) override {
    out.insert(out.end(), dropped_.begin(), dropped_.end());
    dropped_.clear();
  }

  // The server key of `key`.
  std::string ServerKey(const PrefixKey& key) const;
  // For operators: the models that have entries in this tier's namespace (identity -> number of
  // entries), and deleting every entry of one model there (SCAN, then DEL in batches; the count
  // deleted). Entries stored while it runs may survive it. kIoError when the server fails.
  Result<std::vector<std::pair<ModelIdentity, int64_t>>> ListModels();
  Result<int64_t> DropModel(const ModelIdentity& model);
  const std::string& server() const { return server_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t corruptions_detected() const { return corruptions_; }
  int64_t forgeries_refused() const { return forgeries_; }
  int64_t server_errors() const { return server_errors_; }
  int64_t reconnects() const { return reconnects_; }
  // Requests sent and answered: one per call, one per pipelined batch.
  int64_t round_trips() const { return round_trips_; }

 private:
  explicit RemoteTier(const RemoteTierOptions& options);
  // A live connection, reconnecting if the retry interval passed; the failure otherwise.
  Status Ready() const;
  Status Open() const;
  // Records a failed command and drops the connection.
  Status Fail(const char* what) const;
  // The signature of a value under server key `k`.
  void Sign(const std::string& k, std::span<const unsigned char> header,
            std::span<const unsigned char> payload, unsigned char* out) const;
  // Deletes these server keys in one round trip, as a best effort.
  void DeleteAll(std::span<const std::string> keys);
  // The header (and signature) of the value stored under server key `k` for `key` into `h`;
  // its length.
  size_t BuildHead(const std::string& k, const PrefixKey& key, std::span<const unsigned char> bytes,
                   unsigned char* h) const;
  // Queues EXISTS and GETRANGE for server key `k`; ReceiveGet reads and checks their replies,
  // queueing the key of a damaged or forged value into `dels`.
  void AppendGet(const std::string& k);
  Result<std::vector<unsigned char>> ReceiveGet(const PrefixKey& key, const std::string& k,
                                                std::vector<std::string>& dels);
  // Queues SET k value NX (sending it at once when large); false when the connection failed.
  bool AppendSet(const std::string& k, const PrefixKey& key, std::span<const unsigned char> bytes);
  // After a stored Put: forgets the victims (their server keys into `dels` under kTier) and
  // indexes `key`.
  void IndexStored(const PrefixKey& key, int64_t bytes, std::span<const PrefixKey> victims,
                   std::vector<std::string>& dels);

  RemoteTierOptions options_;
  std::string server_;  // "host:port" or the socket path, for messages
  TierIndex index_;
  mutable redisContext* context_ = nullptr;
  mutable std::chrono::steady_clock::time_point retry_at_{};
  std::vector<unsigned char> sign_key_;  // derived from the secret; empty without one
  std::vector<unsigned char> value_;     // Put's scratch
  bool track_ = false;
  std::vector<PrefixKey> dropped_;
  void Dropped(const PrefixKey& key) {
    if (track_) dropped_.push_back(key);
  }
  mutable int64_t hits_ = 0, misses_ = 0, corruptions_ = 0, forgeries_ = 0, server_errors_ = 0,
                  reconnects_ = 0, round_trips_ = 0;
};

}  // namespace hkv
