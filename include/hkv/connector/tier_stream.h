// Tier streams: prefill -> decode transfer that starts before prefill ends. The prefill engine
// offloads into a TierStreamSender, which sends each block the moment the engine publishes it;
// the decode engine offloads from a TierStreamReceiver, which takes the blocks in on a thread of
// its own while the decode engine already runs and hits what has arrived.
//
// Contract:
// - The stream is a 24-byte header (magic, version, checksum), then per block a 40-byte entry
//   header (key, length, checksum; tier_transfer.h's) and its bytes, then an end marker. Entry
//   bytes are the block streams the connector exports; each checks itself when loaded, so a
//   damaged one is a miss and the decode side recomputes.
// - TierStreamSender is a send-only Tier: Put writes one entry (all of it, retrying short writes
//   and EINTR, without SIGPIPE) and remembers the key, so Contains is true for what was sent and a
//   second Put of a key sends nothing; Get misses. Finish writes the end marker. A write that
//   fails is kIoError and every later Put fails the same way: the receiver sees a cut stream.
// - TierStreamReceiver is a Tier over host memory that a reader thread fills from the
//   descriptor: every call is safe while the thread runs (one mutex). running() says whether the
//   thread still reads; Wait() blocks until it stopped and returns why:
//   Ok after the end marker; kIoError for a stream cut short (a prefill process that died) -
//   every whole entry before the cut is kept; kInvalidArgument for a damaged stream or entry
//   header; kResourceExhausted for an entry longer than max_entry_bytes (nothing of it is read
//   into memory). The descriptor stays the caller's; the destructor stops the thread (it polls a
//   stop flag) and joins it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include <hkv/connector/host_tier.h>
#include <hkv/connector/tier.h>
#include <hkv/connector/tier_index.h>

namespace hkv {

class TierStreamSender final : public IndexedTier {
 public:
  // Writes the stream header; kIoError when the descriptor cannot take it.
  static Result<std::unique_ptr<TierStreamSender>> Open(int fd);

  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;
  std::string_view medium() const override { return "STREAM"; }
  // The end marker: the receiver's Wait returns Ok once it read everything before it.
  Status Finish();
  int64_t entries_sent() const { return sent_; }

 private:
  explicit TierStreamSender(int fd);
  int fd_;
  Status failed_ = Status::Ok();
  int64_t sent_ = 0;
};

class TierStreamReceiver final : public Tier {
 public:
  static Result<std::unique_ptr<TierStreamReceiver>> Start(int fd, int64_t capacity_bytes,
                                                           int64_t max_entry_bytes);
  ~TierStreamReceiver() override;
  TierStreamReceiver(const TierStreamReceiver&) = delete;
  TierStreamReceiver& operator=(const TierStreamReceiver&) = delete;

  bool Contains(const PrefixKey& key) const override;
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override;
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override;
  Status Pin(const PrefixKey& key) override;
  Status Unpin(const PrefixKey& key) override;
  Status Evict(const PrefixKey& key) override;
  int64_t capacity_bytes() const override;
  int64_t used_bytes() const override;
  std::vector<PrefixKey> LruOrder() const override;
  std::string_view medium() const override { return "CPU"; }
  void TrackDropped(bool on) override;
  void TakeDropped(std::vector<PrefixKey>& out) override;

  bool running() const { return running_; }
  Status Wait();
  int64_t entries_received() const;

 private:
  TierStreamReceiver(int fd, int64_t capacity_bytes, int64_t max_entry_bytes);
  void Read();
  // Reads exactly n bytes unless stopped, the peer closed or an error came; false then.
  bool ReadExactly(unsigned char* p, size_t n, Status& why);

  int fd_;
  int64_t max_entry_bytes_;
  mutable std::mutex mu_;  // guards inbox_, received_, status_
  HostTier inbox_;
  int64_t received_ = 0;
  Status status_ = Status::Ok();
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{true};
  std::thread reader_;
};

}  // namespace hkv
